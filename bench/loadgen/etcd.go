package main

// etcd mode, the comparison: --count leases granted at --ttl (etcd raises it
// to its minimum and says so in the grant), a key /bench/<id> put under each,
// kept alive the way etcd's own client does it (clientv3/lease.go of v3.4),
// and one Watch on the /bench/ prefix that prints each key's DELETE (its
// lease expired) with the time it arrived and the lease it was under.
//
// A simulated client is one clientv3 lessor: one LeaseKeepAlive stream
// (opened with clientv3's "hasleader" metadata) carrying the keepalives of
// its --leases-per-client leases (1 by default: every node runs its own
// client, as a fleet does; K > 1 multiplexes K leases on one stream, as one
// clientv3 process holding K leases does). Its cadence is clientv3's:
//   - a send loop wakes every 500 ms (retryConnWait) and sends one
//     LeaseKeepAliveRequest for every lease whose nextKeepAlive has passed
//     (a new lease's is "now": its first keepalive goes at the next pass);
//   - a response with TTL > 0 sets nextKeepAlive = now + TTL/3 and the
//     deadline = now + TTL; so at TTL 1 s a lease is renewed every 0.5 s
//     (every 1.0 s once a response takes more than 1/6 s), at 2 s every 1 s;
//   - a response with TTL <= 0 says etcd no longer has the lease: clientv3
//     drops it; here it is counted ("expired") and, with --regrant (the
//     default), granted again 1 to 2 s later with its key put again, as a
//     registration loop does, so that N leases stay under load;
//   - a stream that ends is reopened 500 ms later.
// --cadence fixed instead renews every live lease every TTL/3 whatever the
// answers (the load generator's schedule before it followed clientv3), to
// tell clientv3's cadence from etcd's server in a result.
// clientv3 also gives a lease up when no response came by its deadline (its
// deadlineLoop); here that is only counted ("deadline_missed", once per
// lapse) and the keepalives go on, so a lease is lost only when etcd says so.
//
// Grants run on --grant-concurrency goroutines (each a LeaseGrant then a
// Put); a failed one is retried after 0.5 s (counted), never fatal. A lease's
// keepalives start as soon as it is granted. "ready" is printed when every
// lease has been granted once; the reports carry "granted" meanwhile.
//
// "kill ID" stops a lease's keepalives (with one lease per client its stream
// is cancelled) and prints the lease killed. Messages hand-encoded (etcd
// etcdserver/etcdserverpb/rpc.proto, mvcc/mvccpb/kv.proto of v3.4).

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

var etcdStream = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// retryConnWait is clientv3's send-loop period and stream retry delay, seconds.
const retryConnWait = 0.5

// etcdLease is one lease holder (a simulated node). Its fields after id and
// cl are guarded by cl.mu.
type etcdLease struct {
	id       string
	cl       *etcdClient
	once     int32   // granted at least once (atomic)
	lease    int64   // 0 while (re)granting
	next     float64 // its next keepalive is due (clientv3's nextKeepAlive)
	deadline float64 // no response by then: clientv3 would give the lease up
	missed   bool    // the deadline passed without a response (counted once)
	sentAt   float64
	killed   bool
}

// etcdClient is one simulated clientv3 lessor: one keepalive stream.
type etcdClient struct {
	g       *etcdGen
	conn    *grpc.ClientConn
	mu      sync.Mutex
	leases  []*etcdLease
	byLease map[int64]*etcdLease
	live    int // leases not killed
	start   sync.Once
	killc   chan struct{} // closed when every lease of the client is killed
}

type etcdGen struct {
	leases    []*etcdLease
	byID      map[string]*etcdLease
	clients   []*etcdClient
	ttl       int64
	grantQ    chan *etcdLease
	regrant   bool
	fixed     bool  // --cadence fixed: every live lease every TTL/3
	granted   int64 // leases granted at least once
	sent      uint64
	acks      uint64
	renewed   uint64 // responses with TTL > 0
	notFound  uint64 // responses with TTL <= 0
	expired   uint64 // leases etcd said it no longer had (each once)
	regrants  uint64
	grantErrs uint64
	missed    uint64 // clientv3 deadlines passed without a response
	lat       hist
	latTotal  summary
	late      hist
	lateTotal summary
	errMu     sync.Mutex
	errs      map[string]int
	lastSent  uint64
	lastRenew uint64
	t0, cpu0  float64
	every     float64
}

func (g *etcdGen) noteErr(err error) {
	g.errMu.Lock()
	code := status.Code(err).String()
	g.errs[code]++
	first := g.errs[code] == 1 && len(g.errs) <= 5
	g.errMu.Unlock()
	if first {
		fmt.Fprintf(os.Stderr, "loadgen etcd: %v\n", err)
	}
}

func runEtcd(argv []string) {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	endpoints := fs.String("endpoints", "", "etcd client addresses, host:port,...")
	prefix := fs.String("prefix", "n", "lease holder id prefix")
	first := fs.Int("first", 0, "number of the first")
	count := fs.Int("count", 100, "leases")
	ttl := fs.Int64("ttl", 1, "TTL asked for, seconds (etcd grants at least its minimum)")
	perClient := fs.Int("leases-per-client", 1, "leases multiplexed on one client's keepalive stream")
	perConn := fs.Int("streams-per-conn", 100, "keepalive streams (clients) per connection")
	grantConc := fs.Int("grant-concurrency", 64, "grants (LeaseGrant + Put) in flight")
	regrant := fs.Bool("regrant", true, "grant a lease again when etcd says it expired")
	cadence := fs.String("cadence", "clientv3", "clientv3 (500 ms passes, TTL/3 after an answer) or fixed (every TTL/3)")
	watch := fs.Bool("watch", true, "watch the /bench/ prefix and print DELETEs")
	report := fs.Float64("report", 1.0, "seconds between reports")
	offset := fs.Int("member-offset", 0, "connection i goes to endpoint (i + offset) mod len")
	fs.Parse(argv)
	if *perClient < 1 {
		*perClient = 1
	}
	addrs := strings.Split(*endpoints, ",")
	g := &etcdGen{byID: map[string]*etcdLease{}, errs: map[string]int{}, every: *report,
		regrant: *regrant, grantQ: make(chan *etcdLease, *count), fixed: *cadence == "fixed"}
	if *cadence != "clientv3" && *cadence != "fixed" {
		fatal("etcd: --cadence %q: clientv3 or fixed", *cadence)
	}
	dial := func(addr string) *grpc.ClientConn {
		c, err := grpc.Dial(addr, grpc.WithInsecure(), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			fatal("etcd: dial %s: %v", addr, err)
		}
		return c
	}
	nclients := (*count + *perClient - 1) / *perClient
	nconn := (nclients + *perConn - 1) / *perConn
	var conns []*grpc.ClientConn
	for i := 0; i < nconn; i++ {
		conns = append(conns, dial(addrs[(i+*offset)%len(addrs)])) // clients spread over the members
	}
	for i := 0; i < nclients; i++ {
		g.clients = append(g.clients, &etcdClient{g: g, conn: conns[i%nconn],
			byLease: map[int64]*etcdLease{}, killc: make(chan struct{})})
	}
	for i := 0; i < *count; i++ {
		c := g.clients[i / *perClient]
		l := &etcdLease{id: fmt.Sprintf("%s%d", *prefix, *first+i), cl: c}
		c.leases = append(c.leases, l)
		c.live++
		g.leases = append(g.leases, l)
		g.byID[l.id] = l
	}
	if *watch {
		go g.watch(dial(addrs[0]), "/bench/")
	}
	t0 := mono()
	go func() {
		for {
			time.Sleep(time.Duration(*report * 1e9))
			emit(g.snapshot(false))
		}
	}()
	var initial sync.WaitGroup
	initial.Add(*count)
	for w := 0; w < *grantConc; w++ {
		go func() {
			for l := range g.grantQ {
				if g.grant(l, *ttl) && atomic.CompareAndSwapInt32(&l.once, 0, 1) {
					atomic.AddInt64(&g.granted, 1)
					initial.Done()
				}
			}
		}()
	}
	for _, l := range g.leases {
		g.grantQ <- l
	}
	initial.Wait()
	g.t0, g.cpu0 = mono(), cpuSeconds()
	emit(map[string]interface{}{"ev": "ready", "t": g.t0, "leases": *count, "ttl": atomic.LoadInt64(&g.ttl),
		"grant_s": g.t0 - t0, "clients": nclients, "conns": nconn})
	serveCommands(g)
}

// grant gets l a lease and puts its key under it, retrying every 0.5 s until
// it succeeds (true) or l is killed meanwhile (false). The lease's keepalives
// start as soon as it is granted (before the Put), with clientv3's first
// deadline (5 s).
func (g *etcdGen) grant(l *etcdLease, ttl int64) bool {
	c := l.cl
	for {
		c.mu.Lock()
		killed := l.killed
		c.mu.Unlock()
		if killed {
			return false
		}
		var resp []byte
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.conn.Invoke(ctx, "/etcdserverpb.Lease/LeaseGrant", appendVarint(nil, 1, uint64(ttl)), &resp)
		var id int64
		if err == nil {
			eachField(resp, func(f field) {
				switch f.num {
				case 2:
					id = int64(f.u)
				case 3:
					atomic.StoreInt64(&g.ttl, int64(f.u))
				}
			})
			now := mono()
			c.mu.Lock()
			l.lease, l.next, l.deadline, l.missed = id, now, now+5, false
			c.byLease[id] = l
			c.mu.Unlock()
			c.start.Do(func() { go c.run() })
			put := appendBytes(nil, 1, []byte("/bench/"+l.id))
			put = appendBytes(put, 2, []byte("x"))
			put = appendVarint(put, 3, uint64(id))
			err = c.conn.Invoke(ctx, "/etcdserverpb.KV/Put", put, &resp)
		}
		cancel()
		if err == nil {
			return true
		}
		g.noteErr(err)
		atomic.AddUint64(&g.grantErrs, 1)
		if id != 0 { // the lease without its key is dropped (it expires on its own)
			c.mu.Lock()
			if l.lease == id {
				l.lease = 0
			}
			delete(c.byLease, id)
			c.mu.Unlock()
		}
		time.Sleep(time.Duration((0.5 + 0.5*rand.Float64()) * 1e9))
	}
}

// run keeps the client's stream open until every lease of it is killed; a
// stream that ends is reopened after retryConnWait, as clientv3's
// recvKeepAliveLoop does.
func (c *etcdClient) run() {
	for {
		if !c.stream() {
			return
		}
		select {
		case <-time.After(time.Duration(retryConnWait * 1e9)):
		case <-c.killc:
			return
		}
	}
}

// stream is clientv3's sendKeepAliveLoop on one stream: a pass at once, then
// one every retryConnWait. It returns false when the client is killed, true
// when the stream failed.
func (c *etcdClient) stream() bool {
	g := c.g
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "hasleader", "true"))
	defer cancel()
	st, err := c.conn.NewStream(ctx, etcdStream, "/etcdserverpb.Lease/LeaseKeepAlive")
	if err != nil {
		g.noteErr(err)
		return true
	}
	failed := make(chan struct{})
	go func() {
		defer close(failed)
		var buf []byte
		for {
			if err := st.RecvMsg(&buf); err != nil {
				if ctx.Err() == nil {
					g.noteErr(err)
				}
				return
			}
			c.onResponse(buf)
		}
	}()
	due := mono()
	var reqs [][]byte
	for {
		now := mono()
		g.late.add(now - due)
		reqs = c.due(now, reqs[:0])
		for _, req := range reqs {
			if err := st.SendMsg(req); err != nil {
				select { // the reader has the status
				case <-failed:
				case <-time.After(time.Second):
				}
				return true
			}
			atomic.AddUint64(&g.sent, 1)
		}
		every := retryConnWait
		if g.fixed {
			every = float64(atomic.LoadInt64(&g.ttl)) / 3
		}
		due = mono() + every
		timer := time.NewTimer(time.Duration(every * 1e9))
		select {
		case <-timer.C:
		case <-failed:
			timer.Stop()
			return true
		case <-c.killc:
			timer.Stop()
			return false
		}
	}
}

// due appends the requests of the leases whose keepalive is due at now.
func (c *etcdClient) due(now float64, reqs [][]byte) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.leases {
		if l.killed || l.lease == 0 || (l.next > now && !c.g.fixed) {
			continue
		}
		if now > l.deadline && !l.missed {
			l.missed = true
			atomic.AddUint64(&c.g.missed, 1)
		}
		l.sentAt = now
		reqs = append(reqs, appendVarint(nil, 1, uint64(l.lease)))
	}
	return reqs
}

// onResponse is clientv3's recvKeepAlive.
func (c *etcdClient) onResponse(buf []byte) {
	g := c.g
	var id, ttl int64 // TTL absent = 0 (proto3): etcd no longer has the lease
	eachField(buf, func(f field) {
		switch f.num {
		case 2:
			id = int64(f.u)
		case 3:
			ttl = int64(f.u)
		}
	})
	now := mono()
	atomic.AddUint64(&g.acks, 1)
	c.mu.Lock()
	l := c.byLease[id]
	if l == nil { // an earlier lease of a holder granted again
		c.mu.Unlock()
		return
	}
	g.lat.add(now - l.sentAt)
	if ttl > 0 {
		atomic.AddUint64(&g.renewed, 1)
		l.next = now + float64(ttl)/3
		l.deadline = now + float64(ttl)
		l.missed = false
		c.mu.Unlock()
		return
	}
	atomic.AddUint64(&g.notFound, 1)
	delete(c.byLease, id)
	lost := !l.killed && l.lease == id
	if lost {
		l.lease = 0
	}
	c.mu.Unlock()
	if lost {
		atomic.AddUint64(&g.expired, 1)
		emit(map[string]interface{}{"ev": "expired", "node": l.id, "lease": id, "t": now})
		if g.regrant {
			atomic.AddUint64(&g.regrants, 1)
			go func() { // after 1 to 2 s, as a registration loop backs off
				time.Sleep(time.Duration((1 + rand.Float64()) * 1e9))
				g.grantQ <- l
			}()
		}
	}
}

func (g *etcdGen) kill(ids []string) {
	for _, id := range ids {
		l, ok := g.byID[id]
		if !ok {
			emit(map[string]interface{}{"ev": "error", "error": "kill: no lease holder " + id})
			continue
		}
		c := l.cl
		c.mu.Lock()
		if l.killed || l.lease == 0 {
			c.mu.Unlock()
			emit(map[string]interface{}{"ev": "error", "error": "kill: no live lease " + id, "node": id})
			continue
		}
		l.killed = true
		lease := l.lease
		c.live--
		if c.live == 0 {
			close(c.killc) // its stream is cancelled
		}
		c.mu.Unlock()
		emit(map[string]interface{}{"ev": "killed", "node": id, "lease": lease, "t": mono()})
	}
}

func (g *etcdGen) join(int)      {}
func (g *etcdGen) gaps([]string) {}

// period is the renewal period at TTL ttl: clientv3's (with answers faster
// than the remainder) is the first 500 ms pass after TTL/3; fixed: TTL/3.
func (g *etcdGen) period(ttl float64) float64 {
	if g.fixed {
		return ttl / 3
	}
	return retryConnWait * (math.Floor(ttl/3/retryConnWait) + 1)
}

func (g *etcdGen) snapshot(final bool) map[string]interface{} {
	now := mono()
	sent := atomic.LoadUint64(&g.sent)
	renewed := atomic.LoadUint64(&g.renewed)
	lc, lm := g.late.take()
	g.lateTotal.merge(lc, lm)
	ac, am := g.lat.take()
	g.latTotal.merge(ac, am)
	var lw, aw summary
	lw.merge(lc, lm)
	aw.merge(ac, am)
	live := 0
	for _, c := range g.clients {
		c.mu.Lock()
		for _, l := range c.leases {
			if !l.killed && l.lease != 0 {
				live++
			}
		}
		c.mu.Unlock()
	}
	g.errMu.Lock()
	errs := map[string]int{}
	for k, v := range g.errs {
		errs[k] = v
	}
	g.errMu.Unlock()
	ttl := float64(atomic.LoadInt64(&g.ttl))
	req := 0.0
	if ttl > 0 {
		req = math.Round(float64(live)/g.period(ttl)*10) / 10
	}
	r := map[string]interface{}{
		"ev": "report", "t": now, "live": live, "granted": atomic.LoadInt64(&g.granted),
		"sent": sent, "acks": atomic.LoadUint64(&g.acks), "renewed": renewed,
		"not_found": atomic.LoadUint64(&g.notFound), "expired": atomic.LoadUint64(&g.expired),
		"regrants": atomic.LoadUint64(&g.regrants), "grant_errors": atomic.LoadUint64(&g.grantErrs),
		"deadline_missed": atomic.LoadUint64(&g.missed), "errors": errs, "ttl": ttl,
		"required_rate": req,
		"sent_rate":     math.Round(float64(sent-g.lastSent)/g.every*10) / 10,
		"renew_rate":    math.Round(float64(renewed-g.lastRenew)/g.every*10) / 10,
		"late_ms":       lw.ms(), "ack_ms": aw.ms(), "cpu_s": cpuSeconds() - g.cpu0,
	}
	g.lastSent, g.lastRenew = sent, renewed
	if final {
		r["ev"] = "final"
		r["late_ms"] = g.lateTotal.ms()
		r["ack_ms"] = g.latTotal.ms()
	}
	return r
}

func (g *etcdGen) final() { emit(g.snapshot(true)) }
