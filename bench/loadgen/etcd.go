package main

// etcd mode, the comparison: --count leases granted at --ttl (etcd raises it
// to its minimum and says so in the grant), a key /bench/<id> put under each,
// and one etcdserverpb.Lease/LeaseKeepAlive stream per lease sending a
// keepalive every TTL/3 (as clientv3 does); "kill ID" stops a lease's
// keepalives (its stream is cancelled). One etcdserverpb.Watch/Watch on the
// /bench/ prefix prints a "deleted" line with the time each key's DELETE
// arrived (the lease expired). Messages hand-encoded (etcd api/etcdserverpb/rpc.proto).

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
	"google.golang.org/grpc/status"
)

var etcdStream = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

type lease struct {
	id      string
	lease   int64
	kill    chan struct{}
	stopped int32
	conn    *grpc.ClientConn
}

type etcdGen struct {
	leases    []*lease
	byID      map[string]*lease
	ttl       int64
	sent      uint64
	acks      uint64
	expired   uint64
	lat       hist
	latTotal  summary
	late      hist
	lateTotal summary
	errMu     sync.Mutex
	errs      map[string]int
	lastSent  uint64
	t0, cpu0  float64
	every     float64
}

func (g *etcdGen) noteErr(err error) {
	g.errMu.Lock()
	g.errs[status.Code(err).String()]++
	first := len(g.errs) <= 3 && g.errs[status.Code(err).String()] == 1
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
	perConn := fs.Int("streams-per-conn", 100, "keepalive streams per connection")
	watch := fs.Bool("watch", true, "watch the /bench/ prefix and print DELETEs")
	report := fs.Float64("report", 1.0, "seconds between reports")
	fs.Parse(argv)
	addrs := strings.Split(*endpoints, ",")
	g := &etcdGen{byID: map[string]*lease{}, errs: map[string]int{}, every: *report}
	dial := func(addr string) *grpc.ClientConn {
		c, err := grpc.Dial(addr, grpc.WithInsecure(), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			fatal("etcd: dial %s: %v", addr, err)
		}
		return c
	}
	var conns []*grpc.ClientConn
	nconn := (*count + *perConn - 1) / *perConn
	for i := 0; i < nconn; i++ {
		conns = append(conns, dial(addrs[i%len(addrs)]))
	}
	if *watch {
		go g.watch(dial(addrs[0]), "/bench/")
	}
	// grant and put, 64 at a time
	work := make(chan *lease)
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range work {
				g.setup(l, *ttl)
				go g.keepAlive(l) // at once: a TTL of 1 s does not wait for the others' grants
			}
		}()
	}
	for i := 0; i < *count; i++ {
		l := &lease{id: fmt.Sprintf("%s%d", *prefix, *first+i), kill: make(chan struct{}), conn: conns[i%nconn]}
		g.leases = append(g.leases, l)
		g.byID[l.id] = l
		work <- l
	}
	close(work)
	wg.Wait()
	g.t0, g.cpu0 = mono(), cpuSeconds()
	emit(map[string]interface{}{"ev": "ready", "t": g.t0, "leases": *count, "ttl": g.ttl})
	go func() {
		for {
			time.Sleep(time.Duration(*report * 1e9))
			emit(g.snapshot(false))
		}
	}()
	serveCommands(g)
}

func (g *etcdGen) setup(l *lease, ttl int64) {
	for attempt := 0; ; attempt++ {
		var resp []byte
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := l.conn.Invoke(ctx, "/etcdserverpb.Lease/LeaseGrant", appendVarint(nil, 1, uint64(ttl)), &resp)
		if err == nil {
			eachField(resp, func(f field) {
				switch f.num {
				case 2:
					l.lease = int64(f.u)
				case 3:
					atomic.StoreInt64(&g.ttl, int64(f.u))
				}
			})
			put := appendBytes(nil, 1, []byte("/bench/"+l.id))
			put = appendBytes(put, 2, []byte("x"))
			put = appendVarint(put, 3, uint64(l.lease))
			err = l.conn.Invoke(ctx, "/etcdserverpb.KV/Put", put, &resp)
		}
		cancel()
		if err == nil {
			return
		}
		if attempt > 5 {
			fatal("etcd: grant/put for %s: %v", l.id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// keepAlive renews l every TTL/3 until it is killed. A stream that fails
// (etcd under load answers UNAVAILABLE, or a leader change ends it) is
// reopened after 0.2 to 0.4 s, as clientv3's keepalive loop retries: the lease
// is lost only if etcd lets it expire meanwhile.
func (g *etcdGen) keepAlive(l *lease) {
	every := float64(atomic.LoadInt64(&g.ttl)) / 3
	if every <= 0 {
		every = 1.0 / 3
	}
	next := mono() + rand.Float64()*every
	for atomic.LoadInt32(&l.stopped) == 0 {
		var ok bool
		next, ok = g.keepAliveStream(l, every, next)
		if !ok {
			return
		}
		select {
		case <-time.After(time.Duration((0.2 + 0.2*rand.Float64()) * 1e9)):
		case <-l.kill:
			return
		}
	}
}

// keepAliveStream renews on one stream until it fails (returns the next due
// time, true) or the lease is killed (false).
func (g *etcdGen) keepAliveStream(l *lease, every, next float64) (float64, bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := l.conn.NewStream(ctx, etcdStream, "/etcdserverpb.Lease/LeaseKeepAlive")
	if err != nil {
		g.noteErr(err)
		return next, true
	}
	var mu sync.Mutex
	sentAt := 0.0
	failed := make(chan struct{})
	go func() {
		defer close(failed)
		var buf []byte
		for {
			if err := st.RecvMsg(&buf); err != nil {
				if atomic.LoadInt32(&l.stopped) == 0 {
					g.noteErr(err)
				}
				return
			}
			now := mono()
			atomic.AddUint64(&g.acks, 1)
			mu.Lock()
			if sentAt > 0 {
				g.lat.add(now - sentAt)
			}
			mu.Unlock()
			ttl := int64(0) // absent = 0 (proto3): etcd no longer has the lease
			eachField(buf, func(f field) {
				if f.num == 3 {
					ttl = int64(f.u)
				}
			})
			if ttl <= 0 {
				atomic.AddUint64(&g.expired, 1)
			}
		}
	}()
	req := appendVarint(nil, 1, uint64(l.lease))
	timer := time.NewTimer(time.Duration((next - mono()) * 1e9))
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-failed:
			return next, true
		case <-l.kill:
			return next, false
		}
		now := mono()
		g.late.add(now - next)
		mu.Lock()
		sentAt = now
		mu.Unlock()
		if err := st.SendMsg(req); err != nil {
			<-failed // the reader has the status
			return next, true
		}
		atomic.AddUint64(&g.sent, 1)
		next += every
		if next < now {
			next = now + every
		}
		timer.Reset(time.Duration((next - mono()) * 1e9))
	}
}

func (g *etcdGen) watch(conn *grpc.ClientConn, prefix string) {
	ctx := context.Background()
	st, err := conn.NewStream(ctx, etcdStream, "/etcdserverpb.Watch/Watch")
	if err != nil {
		fatal("etcd: watch: %v", err)
	}
	end := []byte(prefix)
	end[len(end)-1]++
	create := appendBytes(nil, 1, []byte(prefix))
	create = appendBytes(create, 2, end)
	if err := st.SendMsg(appendBytes(nil, 1, create)); err != nil {
		fatal("etcd: watch: %v", err)
	}
	var buf []byte
	for {
		if err := st.RecvMsg(&buf); err != nil {
			fatal("etcd: watch ended: %v", err)
		}
		t := mono()
		eachField(buf, func(f field) {
			if f.num != 11 { // events
				return
			}
			var typ uint64
			var key string
			eachField(f.b, func(e field) {
				switch e.num {
				case 1:
					typ = e.u
				case 2:
					eachField(e.b, func(kv field) {
						if kv.num == 1 {
							key = string(kv.b)
						}
					})
				}
			})
			if typ == 1 {
				emit(map[string]interface{}{"ev": "deleted", "node": strings.TrimPrefix(key, prefix), "t": t})
			}
		})
	}
}

func (g *etcdGen) kill(ids []string) {
	for _, id := range ids {
		l, ok := g.byID[id]
		if !ok || !atomic.CompareAndSwapInt32(&l.stopped, 0, 1) {
			emit(map[string]interface{}{"ev": "error", "error": "kill: no live lease " + id})
			continue
		}
		close(l.kill)
		emit(map[string]interface{}{"ev": "killed", "node": id, "t": mono()})
	}
}

func (g *etcdGen) join(int) {}

func (g *etcdGen) snapshot(final bool) map[string]interface{} {
	now := mono()
	sent := atomic.LoadUint64(&g.sent)
	lc, lm := g.late.take()
	g.lateTotal.merge(lc, lm)
	ac, am := g.lat.take()
	g.latTotal.merge(ac, am)
	var lw, aw summary
	lw.merge(lc, lm)
	aw.merge(ac, am)
	live := 0
	for _, l := range g.leases {
		if atomic.LoadInt32(&l.stopped) == 0 {
			live++
		}
	}
	g.errMu.Lock()
	errs := map[string]int{}
	for k, v := range g.errs {
		errs[k] = v
	}
	g.errMu.Unlock()
	ttl := float64(atomic.LoadInt64(&g.ttl))
	r := map[string]interface{}{
		"ev": "report", "t": now, "live": live, "sent": sent, "acks": atomic.LoadUint64(&g.acks),
		"expired": atomic.LoadUint64(&g.expired), "errors": errs, "ttl": ttl,
		"required_rate": math.Round(float64(live)/(ttl/3)*10) / 10,
		"sent_rate":     math.Round(float64(sent-g.lastSent)/g.every*10) / 10,
		"late_ms":       lw.ms(), "ack_ms": aw.ms(), "cpu_s": cpuSeconds() - g.cpu0,
	}
	g.lastSent = sent
	if final {
		r["ev"] = "final"
		r["late_ms"] = g.lateTotal.ms()
		r["ack_ms"] = g.latTotal.ms()
	}
	return r
}

func (g *etcdGen) final() { emit(g.snapshot(true)) }
