package main

// Heartbeat mode: --count simulated nodes, each with one membership.v1
// Heartbeat stream to every arbiter, following the acks' next_interval_seconds
// as the SDK does (membership/_node/agent.py: the interval is the longest one any
// arbiter suggested, 0.15 s until one did; interval_seconds declares it, 0
// before any suggestion). With --interval-rule own each stream follows its own
// arbiter's suggestion instead (a lightly loaded replica at a longer interval).
// As the SDK's slow start (membership/_node/linkrules.py rule 1), a stream keeps one
// heartbeat in flight until an ack on it grants a lease (the node's join
// committed there): the next goes out once the last is acked. The SDK's
// hedging and abandoning of silent streams are not simulated: the load
// generator reopens a stream only when the replica ends it.
//
// Streams are multiplexed: node i uses connection i % C of each arbiter, with
// C = ceil(count / --streams-per-conn) so that no connection needs more than
// the arbiter's max_concurrent_streams (100).

import (
	"container/heap"
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

var errLogs int32

const heartbeatMethod = "/membership.v1.Membership/Heartbeat"

var hbDesc = &grpc.StreamDesc{StreamName: "Heartbeat", ServerStreams: true, ClientStreams: true}

type hbArbiter struct {
	addr      string
	conns     []*grpc.ClientConn
	sent      uint64
	stale     uint64 // heartbeats replaced unwritten by a newer one (the stream's writes blocked)
	acks      uint64
	lat       hist
	latTotal  summary
	epoch     uint64
	mu        sync.Mutex
	errs      map[string]int
	lastSent  uint64
	lastAcks  uint64
	epochsSet map[uint64]bool
}

func (a *hbArbiter) noteErr(code string) {
	a.mu.Lock()
	a.errs[code]++
	a.mu.Unlock()
}

// hbStream is a node's link to one arbiter; its grpc stream is replaced when it fails.
type hbStream struct {
	arb       *hbArbiter
	conn      *grpc.ClientConn
	st        grpc.ClientStream
	cancel    context.CancelFunc
	seq       uint64
	sendT     [32]uint64  // float64 bits of the send time of seq % 32
	state     uint32      // last state acked
	suggested uint64      // float64 bits of the last next_interval_seconds (0: none)
	down      int32       // 1 once the stream failed
	gen       uint64      // atomic: which opening of the link the current stream is
	leasedGen uint64      // atomic: the latest opening on which an ack granted a lease
	inflight  int32       // atomic: 1 while a heartbeat sent is not acked (slow start)
	pushback  uint64      // atomic: float64 bits of the time before which no stream opens (a shed's hint)
	mbox      chan []byte // the newest heartbeat not yet written (the SDK's rule 2)
	retryAt   float64     // shard only: when a down link is opened again (0: not yet set)
	opening   int32       // atomic: 1 while a NewStream is in flight
	wasDown   bool        // shard only: the link was down at the last look
	mu        sync.Mutex  // guards st, cancel, mbox (set by the opening goroutine)
	next      float64     // scheduled time of the next send
	// the node's own send gaps (shard only): between two heartbeats created on one
	// opening of the link after it granted a lease, the time from one to the next
	lastAt     float64 // when the last heartbeat was created (0: none on this opening)
	lastGen    uint64  // the opening it was created on
	lastLeased bool    // the link had granted a lease when it was created
	lastIv     float64 // the interval in force when it was created
	maxGap     float64 // the longest gap, seconds
	maxRatio   float64 // the longest gap over the interval in force at its end
	gapIv      float64 // that interval, seconds
}

type hbNode struct {
	id       string
	inc      uint64
	prefix   []byte // node_id, incarnation, labels: the fields every heartbeat repeats
	links    []*hbStream
	rejoin   uint64 // atomic: the incarnation to rejoin at (0: none)
	started  int32
	stopped  int32
	interval uint64 // float64 bits: the interval in force (max rule)
	step     uint64
	shard    *hbShard
	due      float64 // the earliest time one of its links needs attention
	opened   bool
	hidx     int
}

type hbGen struct {
	arbs        []*hbArbiter
	nodes       []*hbNode
	byID        map[string]*hbNode
	rule        string
	defInterval float64
	spread      float64
	late        hist
	lateTotal   summary
	nextJoin    int
	joinMu      sync.Mutex
	rejoins     uint64
	lefts       uint64
	reportEvery float64
	t0          float64
	cpu0        float64
	shards      []*hbShard
	tick        float64
}

func runHeartbeats(argv []string) {
	fs := flag.NewFlagSet("hb", flag.ExitOnError)
	arbiters := fs.String("arbiters", "", "arbiter addresses, host:port,host:port,...")
	prefix := fs.String("prefix", "n", "node id prefix")
	first := fs.Int("first", 0, "number of the first node")
	count := fs.Int("count", 100, "nodes to simulate")
	inc := fs.Uint64("incarnation", 0, "incarnation of every node (0: milliseconds since the epoch)")
	perConn := fs.Int("streams-per-conn", 90, "heartbeat streams per connection")
	rule := fs.String("interval-rule", "max", "max: the SDK's rule (longest suggestion of any arbiter); own: each stream its arbiter's")
	defInterval := fs.Float64("default-interval", 0.15, "interval before any ack suggested one, seconds (the SDK's heartbeat_interval)")
	spread := fs.Float64("start-spread", 0.05, "nodes of a join start uniformly within this many seconds")
	waitJoin := fs.Bool("wait-join", false, "start no node before a \"join\" command")
	report := fs.Float64("report", 1.0, "seconds between reports")
	tick := fs.Float64("tick", 0, "sends are rounded up to this grid, seconds, so that one connection's go out together (0: exact; lateness counts the rounding)")
	fs.Parse(argv)
	if *arbiters == "" {
		fatal("hb: --arbiters is required")
	}
	if *rule != "max" && *rule != "own" {
		fatal("hb: --interval-rule must be max or own")
	}
	if *inc == 0 {
		*inc = uint64(time.Now().UnixNano() / 1e6)
	}
	g := &hbGen{rule: *rule, defInterval: *defInterval, spread: *spread, byID: map[string]*hbNode{}, reportEvery: *report, tick: *tick}
	nconn := (*count + *perConn - 1) / *perConn
	if nconn < 1 {
		nconn = 1
	}
	for _, addr := range strings.Split(*arbiters, ",") {
		a := &hbArbiter{addr: addr, errs: map[string]int{}, epochsSet: map[uint64]bool{}}
		for i := 0; i < nconn; i++ {
			c, err := grpc.Dial(addr, grpc.WithInsecure(), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
			if err != nil {
				fatal("hb: dial %s: %v", addr, err)
			}
			a.conns = append(a.conns, c)
		}
		g.arbs = append(g.arbs, a)
	}
	for i := 0; i < *count; i++ {
		n := &hbNode{id: fmt.Sprintf("%s%d", *prefix, *first+i), inc: *inc}
		n.interval = math.Float64bits(*defInterval)
		n.setPrefix()
		for _, a := range g.arbs {
			n.links = append(n.links, &hbStream{arb: a, conn: a.conns[i%nconn], down: 1})
		}
		g.nodes = append(g.nodes, n)
		g.byID[n.id] = n
	}
	for k := 0; k < nconn; k++ {
		sh := &hbShard{g: g, cmds: make(chan func(), 16)}
		g.shards = append(g.shards, sh)
		go sh.run()
	}
	for i, n := range g.nodes {
		n.shard = g.shards[i%nconn]
	}
	g.t0, g.cpu0 = mono(), cpuSeconds()
	emit(map[string]interface{}{"ev": "ready", "t": g.t0, "nodes": *count, "conns_per_arbiter": nconn, "rule": *rule})
	if !*waitJoin {
		g.join(-1)
	}
	go g.reporter()
	serveCommands(g)
}

func (n *hbNode) setPrefix() {
	b := appendString(nil, 1, n.id)
	b = appendVarint(b, 2, n.inc)
	// labels (map<string,string> = 5): two static labels, as a training job's node would carry
	for _, kv := range [][2]string{{"role", "worker"}, {"pool", "bench"}} {
		e := appendString(nil, 1, kv[0])
		e = appendString(e, 2, kv[1])
		b = appendBytes(b, 5, e)
	}
	n.prefix = b
}

func (g *hbGen) join(k int) {
	g.joinMu.Lock()
	defer g.joinMu.Unlock()
	start := g.nextJoin
	end := len(g.nodes)
	if k >= 0 && start+k < end {
		end = start + k
	}
	t := mono()
	for _, n := range g.nodes[start:end] {
		atomic.StoreInt32(&n.started, 1)
		n := n
		due := t + rand.Float64()*g.spread
		n.shard.cmds <- func() { n.due = due; heap.Push(&n.shard.h, n) }
	}
	g.nextJoin = end
	emit(map[string]interface{}{"ev": "joined", "t": t, "from": start, "to": end})
}

func (g *hbGen) kill(ids []string) {
	for _, id := range ids {
		n, ok := g.byID[id]
		if !ok || atomic.LoadInt32(&n.started) == 0 || !atomic.CompareAndSwapInt32(&n.stopped, 0, 1) {
			emit(map[string]interface{}{"ev": "error", "error": "kill: no running node " + id})
			continue
		}
		done := make(chan float64)
		n.shard.cmds <- func() {
			for _, s := range n.links {
				s.mu.Lock()
				if s.cancel != nil {
					s.cancel()
				}
				s.mu.Unlock()
			}
			done <- mono()
		}
		emit(map[string]interface{}{"ev": "killed", "node": id, "t": <-done, "incarnation": n.inc})
	}
}

// interval of a link: the SDK's rule (the longest suggestion) or the link's own.
func (g *hbGen) intervalOf(n *hbNode, s *hbStream) (float64, bool) {
	if g.rule == "own" {
		v := math.Float64frombits(atomic.LoadUint64(&s.suggested))
		if v > 0 {
			return v, true
		}
		return g.defInterval, false
	}
	best, any := 0.0, false
	for _, l := range n.links {
		if v := math.Float64frombits(atomic.LoadUint64(&l.suggested)); v > 0 {
			any = true
			if v > best {
				best = v
			}
		}
	}
	if !any {
		return g.defInterval, false
	}
	return best, true
}

// open replaces the link's stream by a new one, opened on a goroutine of its
// own: NewStream can block (the connection is not up yet, or it carries the
// replica's max_concurrent_streams), and a shard must not stall its other
// nodes for that. The link is down until the stream is open.
func (g *hbGen) open(n *hbNode, s *hbStream, now float64) {
	if !atomic.CompareAndSwapInt32(&s.opening, 0, 1) {
		return
	}
	// the old stream's reader sees a new generation first: our own cancel is not
	// counted as the replica's error
	gen := atomic.AddUint64(&s.gen, 1)
	atomic.StoreInt32(&s.down, 1)
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
	s.mu.Unlock()
	go func() {
		defer atomic.StoreInt32(&s.opening, 0)
		ctx, cancel := context.WithCancel(context.Background())
		st, err := s.conn.NewStream(ctx, hbDesc, heartbeatMethod)
		if err != nil {
			cancel()
			s.arb.noteErr(status.Code(err).String())
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if atomic.LoadInt32(&n.stopped) == 1 || atomic.LoadUint64(&s.gen) != gen {
			cancel()
			return
		}
		s.st, s.cancel = st, cancel
		s.mbox = make(chan []byte, 1)
		atomic.StoreInt32(&s.inflight, 0)
		go g.read(n, s, st, gen)
		go g.write(s, st, s.mbox, ctx, gen)
		atomic.StoreInt32(&s.down, 0)
	}()
}

// write sends what the shard hands over, from a goroutine of the stream's own
// (membership/_node/heartbeats.py rule 2): a stream whose writes block (the replica
// does not read: HTTP/2 flow control) holds up no other node, and a heartbeat
// not yet written when the next one comes is dropped (counted: "stale").
func (g *hbGen) write(s *hbStream, st grpc.ClientStream, mbox chan []byte, ctx context.Context, gen uint64) {
	for {
		select {
		case <-ctx.Done():
			return
		case req := <-mbox:
			if err := st.SendMsg(req); err != nil {
				// io.EOF: the stream ended; its status is the reader's (RecvMsg), which
				// marks the link down
				return
			}
			atomic.AddUint64(&s.arb.sent, 1)
		}
	}
}

func (g *hbGen) read(n *hbNode, s *hbStream, st grpc.ClientStream, gen uint64) {
	var buf []byte
	for {
		if err := st.RecvMsg(&buf); err != nil {
			if atomic.LoadUint64(&s.gen) == gen {
				if atomic.LoadInt32(&n.stopped) == 0 {
					s.arb.noteErr(status.Code(err).String())
					// a replica shedding new nodes says when to come back (gRFC A6), and
					// the SDK waits that long (membership/_node/heartbeats.py rule 5)
					if v := st.Trailer().Get("grpc-retry-pushback-ms"); len(v) > 0 {
						if ms, perr := strconv.ParseUint(v[0], 10, 32); perr == nil {
							atomic.StoreUint64(&s.pushback, math.Float64bits(mono()+float64(ms)/1000))
						}
					}
					if atomic.AddInt32(&errLogs, 1) <= 5 {
						fmt.Fprintf(os.Stderr, "loadgen: %s stream to %s ended: %v\n", n.id, s.arb.addr, err)
					}
				}
				atomic.StoreInt32(&s.down, 1)
			}
			return
		}
		now := mono()
		a, err := decodeAck(buf)
		if err != nil {
			s.arb.noteErr("bad_ack")
			continue
		}
		atomic.AddUint64(&s.arb.acks, 1)
		atomic.StoreInt32(&s.inflight, 0)
		if t := math.Float64frombits(atomic.LoadUint64(&s.sendT[a.seq%32])); t > 0 {
			s.arb.lat.add(now - t)
		}
		for {
			old := atomic.LoadUint64(&s.arb.epoch)
			if a.epoch <= old || atomic.CompareAndSwapUint64(&s.arb.epoch, old, a.epoch) {
				break
			}
		}
		atomic.StoreUint32(&s.state, uint32(a.state))
		if a.lease > 0 {
			atomic.StoreUint64(&s.leasedGen, gen) // slow start is over on this stream
		}
		if a.nextInterval > 0 {
			atomic.StoreUint64(&s.suggested, math.Float64bits(a.nextInterval))
		}
		// The session's rule 4 (membership/_node/session.py): told DEAD at our incarnation,
		// or that a higher one is recorded, the node rejoins above it.
		if (a.state == 3 && a.incarnation <= n.inc) || a.incarnation > n.inc {
			target := a.incarnation
			if target < n.inc {
				target = n.inc
			}
			atomic.StoreUint64(&n.rejoin, target+1)
		}
		if a.state == 4 && a.incarnation == n.inc {
			atomic.AddUint64(&g.lefts, 1)
		}
	}
}

// waiting is true while the link's stream is in slow start (no ack on it granted a
// lease yet) with a heartbeat in flight: it takes no other until that one is acked
// (the SDK's rule, membership/_node/linkrules.py rule 1).
func (s *hbStream) waiting() bool {
	gen := atomic.LoadUint64(&s.gen)
	return atomic.LoadUint64(&s.leasedGen) != gen && atomic.LoadInt32(&s.inflight) == 1
}

// status is a NodeStatus with a few realistic fields: load, gpu_utilization, phase, step.
func (n *hbNode) status() []byte {
	b := appendDouble(nil, 1, 3.5+float64(n.step%7)*0.1)
	b = appendDouble(b, 2, 0.9)
	b = appendString(b, 3, "allreduce")
	return appendVarint(b, 4, n.step)
}
