package main

// Subscriber mode: --count membership.v1 Subscribe streams, spread over the
// arbiters, each recording when it received every committed change. One line
// per epoch once every subscriber received it (or --epoch-wait seconds after
// the first did): the first and last receive time, how many subscribers got
// it, the nodes it made DEAD or LEFT, and the ALIVE members of the view after
// it (the first subscriber's snapshot, then each epoch as first received).
// With --times the line also carries, per serving arbiter (the event's
// arbiter_id), every subscriber's receive time of that epoch in wall-clock
// seconds (CLOCK_REALTIME, the clock of the replicas' log timestamps), so that
// the fan-out benchmark (bench/fanout.py) can time each delivery from the
// replica's apply.

import (
	"context"
	"flag"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

const subscribeMethod = "/membership.v1.Membership/Subscribe"

var subDesc = &grpc.StreamDesc{StreamName: "Subscribe", ServerStreams: true}

type epochSeen struct {
	first, last float64
	subs        int
	dead, left  []string
	evidence    map[string]map[string]float64 // dead node -> arbiter id -> its silence, seconds
	alive       int
	changes     int
	printed     bool
	recv        map[string][]float64 // --times: arbiter id -> wall-clock receive times
}

type subGen struct {
	mu        sync.Mutex
	count     int
	epochs    map[uint64]*epochSeen
	view      map[string]uint64 // the view: node -> state
	applied   uint64            // the last epoch applied to it
	maxEpoch  uint64
	snapshots uint64
	open      int64
	errs      map[string]int
	wait      float64
	cpu0      float64
	times     bool
}

func runSubscribers(argv []string) {
	fs := flag.NewFlagSet("sub", flag.ExitOnError)
	arbiters := fs.String("arbiters", "", "arbiter addresses, host:port,...")
	count := fs.Int("count", 1, "subscriptions")
	perConn := fs.Int("streams-per-conn", 90, "subscriptions per connection")
	wait := fs.Float64("epoch-wait", 5, "seconds after its first receipt an epoch is reported anyway")
	report := fs.Float64("report", 1.0, "seconds between reports")
	times := fs.Bool("times", false, "print every subscriber's wall-clock receive time of each epoch")
	fs.Parse(argv)
	addrs := strings.Split(*arbiters, ",")
	if *arbiters == "" {
		fatal("sub: --arbiters is required")
	}
	g := &subGen{count: *count, epochs: map[uint64]*epochSeen{}, view: map[string]uint64{}, errs: map[string]int{}, wait: *wait, cpu0: cpuSeconds(), times: *times}
	conns := map[string][]*grpc.ClientConn{}
	for i := 0; i < *count; i++ {
		addr := addrs[i%len(addrs)]
		k := (i / len(addrs)) / *perConn
		for len(conns[addr]) <= k {
			c, err := grpc.Dial(addr, grpc.WithInsecure(), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(1<<30)))
			if err != nil {
				fatal("sub: dial %s: %v", addr, err)
			}
			conns[addr] = append(conns[addr], c)
		}
		go g.follow(i, conns[addr][k])
	}
	emit(map[string]interface{}{"ev": "ready", "t": mono(), "subscribers": *count})
	go func() {
		for {
			time.Sleep(time.Duration(*report * 1e9))
			g.flush(false)
		}
	}()
	serveCommands(g)
}

func (g *subGen) kill([]string) {}
func (g *subGen) join(int)      {}
func (g *subGen) gaps([]string) {}
func (g *subGen) final()        { g.flush(true) }

func (g *subGen) follow(i int, conn *grpc.ClientConn) {
	for {
		err := g.once(i, conn)
		g.mu.Lock()
		g.errs[status.Code(err).String()]++
		g.mu.Unlock()
		time.Sleep(time.Second)
	}
}

func (g *subGen) once(i int, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := conn.NewStream(ctx, subDesc, subscribeMethod)
	if err != nil {
		return err
	}
	req := appendString(nil, 2, fmt.Sprintf("bench-sub-%d", i))
	if err := st.SendMsg(req); err != nil {
		return err
	}
	st.CloseSend()
	atomic.AddInt64(&g.open, 1)
	defer atomic.AddInt64(&g.open, -1)
	var buf []byte
	for {
		if err := st.RecvMsg(&buf); err != nil {
			return err
		}
		t, wall := mono(), float64(time.Now().UnixNano())*1e-9
		var arbiter string
		var change []byte
		eachField(buf, func(f field) {
			switch f.num {
			case 1: // arbiter_id
				arbiter = string(f.b)
			case 2: // snapshot
				if atomic.AddUint64(&g.snapshots, 1) == 1 {
					g.snapshot(f.b)
				}
			case 3: // change
				change = f.b
			}
		})
		if change != nil {
			g.change(i, change, t, arbiter, wall)
		}
	}
}

func (g *subGen) snapshot(b []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	eachField(b, func(f field) { // ViewSnapshot.view = 1
		if f.num != 1 {
			return
		}
		eachField(f.b, func(v field) { // View: epoch = 1, members = 2
			switch v.num {
			case 1:
				if v.u > g.maxEpoch {
					g.maxEpoch = v.u
				}
				if v.u > g.applied {
					g.applied = v.u
				}
			case 2:
				var id string
				var state uint64
				eachField(v.b, func(m field) {
					switch m.num {
					case 1:
						id = string(m.b)
					case 3:
						state = m.u
					}
				})
				g.view[id] = state
			}
		})
	})
}

func (g *subGen) change(i int, b []byte, t float64, arbiter string, wall float64) {
	var epoch uint64
	type mc struct {
		id        string
		state     uint64
		forgotten bool
		evidence  map[string]float64 // DEAD: arbiter id -> silence_seconds
	}
	var changes []mc
	eachField(b, func(f field) { // ViewChange: epoch = 1, changes = 2
		switch f.num {
		case 1:
			epoch = f.u
		case 2:
			var c mc
			eachField(f.b, func(m field) {
				switch m.num {
				case 1:
					c.id = string(m.b)
				case 3:
					c.state = m.u
				case 5: // Evidence: arbiter_id = 1, silence_seconds = 2
					var who string
					var silence float64
					eachField(m.b, func(ev field) {
						switch ev.num {
						case 1:
							who = string(ev.b)
						case 2:
							silence = math.Float64frombits(ev.u)
						}
					})
					if c.evidence == nil {
						c.evidence = map[string]float64{}
					}
					c.evidence[who] = silence
				case 7:
					c.forgotten = m.u != 0
				}
			})
			changes = append(changes, c)
		}
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.epochs[epoch]
	fresh := e == nil && epoch > g.applied
	if e == nil {
		e = &epochSeen{first: t, changes: len(changes)}
		g.epochs[epoch] = e
	}
	e.last = t
	e.subs++
	if g.times {
		if e.recv == nil {
			e.recv = map[string][]float64{}
		}
		e.recv[arbiter] = append(e.recv[arbiter], wall)
	}
	if epoch > g.maxEpoch {
		g.maxEpoch = epoch
	}
	// The view: every epoch's changes applied once, from whichever subscriber
	// received it first (every replica serves the same history, each stream in
	// order), so one slow replica's subscribers do not hold it back.
	if fresh {
		g.applied = epoch
		for _, c := range changes {
			if c.forgotten {
				delete(g.view, c.id)
				continue
			}
			g.view[c.id] = c.state
			switch c.state {
			case 3:
				e.dead = append(e.dead, c.id)
				if c.evidence != nil {
					if e.evidence == nil {
						e.evidence = map[string]map[string]float64{}
					}
					e.evidence[c.id] = c.evidence
				}
			case 4:
				e.left = append(e.left, c.id)
			}
		}
		alive := 0
		for _, s := range g.view {
			if s == 2 {
				alive++
			}
		}
		e.alive = alive
	}
	if e.subs >= g.count {
		g.print(epoch, e)
	}
}

func (g *subGen) print(epoch uint64, e *epochSeen) {
	if e.printed {
		return
	}
	e.printed = true
	line := map[string]interface{}{
		"ev": "epoch", "epoch": epoch, "first": e.first, "last": e.last, "subs": e.subs,
		"changes": e.changes, "dead": e.dead, "left": e.left, "alive": e.alive,
	}
	if e.recv != nil {
		line["recv"] = e.recv
	}
	if e.evidence != nil {
		line["evidence"] = e.evidence
	}
	emit(line)
}

func (g *subGen) flush(final bool) {
	g.mu.Lock()
	now := mono()
	keys := []uint64{}
	for k := range g.epochs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return keys[a] < keys[b] })
	for _, k := range keys {
		e := g.epochs[k]
		if !e.printed && (final || now-e.first > g.wait) {
			g.print(k, e)
		}
		if e.printed && now-e.first > 60 {
			delete(g.epochs, k)
		}
	}
	alive := 0
	for _, s := range g.view {
		if s == 2 {
			alive++
		}
	}
	errs := map[string]int{}
	for k, v := range g.errs {
		errs[k] = v
	}
	ev := "report"
	if final {
		ev = "final"
	}
	r := map[string]interface{}{
		"ev": ev, "t": now, "epoch": g.maxEpoch, "alive": alive, "members": len(g.view),
		"open": atomic.LoadInt64(&g.open), "snapshots": atomic.LoadUint64(&g.snapshots),
		"errors": errs, "cpu_s": cpuSeconds() - g.cpu0,
	}
	g.mu.Unlock()
	emit(r)
}
