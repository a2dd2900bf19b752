package main

// The heartbeat mode's sending side: one goroutine per connection index.

import (
	"container/heap"
	"math"
	"math/rand"
	"sync/atomic"
	"time"
)

// hbShard serves the nodes of one connection index from one goroutine (no
// goroutine or timer per node): a heap of the nodes by the time they next need
// attention; the sends of one wake-up go out back to back, so gRPC writes them
// together. Commands (join, kill) run on it, between two wake-ups.
type hbShard struct {
	g    *hbGen
	h    nodeHeap
	cmds chan func()
}

func (sh *hbShard) run() {
	timer := time.NewTimer(time.Hour)
	for {
		wait := time.Hour
		if len(sh.h) > 0 {
			wait = time.Duration((sh.h[0].due - mono()) * 1e9)
		}
		if wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case f := <-sh.cmds:
				if !timer.Stop() {
					<-timer.C
				}
				f()
				continue
			}
		}
		now := mono()
		for len(sh.h) > 0 && sh.h[0].due <= now {
			n := sh.h[0]
			if atomic.LoadInt32(&n.stopped) == 1 {
				heap.Pop(&sh.h)
				continue
			}
			sh.serve(n, now)
			heap.Fix(&sh.h, 0)
		}
	}
}

// serve sends what is due of node n at now (opening or reopening streams) and sets n.due.
func (sh *hbShard) serve(n *hbNode, now float64) {
	g := sh.g
	if !n.opened {
		n.opened = true
		for _, s := range n.links {
			g.open(n, s, now)
			s.next = now // sent once the stream is open
		}
	}
	if r := atomic.SwapUint64(&n.rejoin, 0); r > n.inc {
		n.inc = r
		n.setPrefix()
		atomic.AddUint64(&g.rejoins, 1)
		emit(map[string]interface{}{"ev": "rejoin", "node": n.id, "t": now, "incarnation": r})
		for _, s := range n.links {
			atomic.StoreUint64(&s.suggested, 0)
			atomic.StoreUint32(&s.state, 0)
			g.open(n, s, now)
		}
	}
	wake := math.Inf(1)
	stepped := false
	for _, s := range n.links {
		if atomic.LoadInt32(&s.down) == 1 {
			// down: being opened (look again soon), or failed (open again after a
			// jittered 0.5 to 1.5 s, as the SDK's short jitter after a stream ends, or
			// after the retry hint of a replica that sheds new nodes)
			retry := now + 0.05
			if atomic.LoadInt32(&s.opening) == 0 {
				if s.retryAt == 0 {
					s.retryAt = now + 0.5 + rand.Float64()
					if pb := math.Float64frombits(atomic.LoadUint64(&s.pushback)); pb > s.retryAt {
						s.retryAt = pb // the replica's retry hint (it sheds new nodes)
					}
				} else if now >= s.retryAt {
					s.retryAt = 0
					g.open(n, s, now)
				}
				if s.retryAt > 0 {
					retry = s.retryAt
				}
			}
			if retry < wake {
				wake = retry
			}
			s.wasDown = true
			continue
		}
		if s.wasDown { // just opened: the cadence starts now (waiting to open is not lateness)
			s.wasDown = false
			if s.next < now {
				s.next = now
			}
		}
		iv, declared := g.intervalOf(n, s)
		atomic.StoreUint64(&n.interval, math.Float64bits(iv))
		if now >= s.next && s.waiting() {
			// slow start: the heartbeat in flight is not acked yet; look again
			// one interval on (the cadence goes on, nothing is sent)
			for s.next <= now {
				s.next += iv
			}
		} else if now >= s.next {
			if !stepped {
				n.step++
				stepped = true
			}
			g.late.add(now - s.next)
			s.noteGap(now, iv)
			atomic.StoreInt32(&s.inflight, 1)
			s.seq++
			// a fresh buffer each time: gRPC keeps the slice until its writer sent it
			req := make([]byte, 0, len(n.prefix)+64)
			req = append(req, n.prefix...)
			req = appendVarint(req, 3, s.seq)
			req = appendDouble(req, 4, float64(time.Now().UnixNano())*1e-9)
			req = appendBytes(req, 6, n.status())
			if declared {
				req = appendDouble(req, 7, iv)
			}
			atomic.StoreUint64(&s.sendT[s.seq%32], math.Float64bits(mono()))
			s.mu.Lock()
			mbox := s.mbox
			s.mu.Unlock()
			select {
			case mbox <- req:
			default: // the previous one is still unwritten: replace it
				select {
				case <-mbox:
					atomic.AddUint64(&s.arb.stale, 1)
				default:
				}
				select {
				case mbox <- req:
				default:
				}
			}
			s.next += iv
			if s.next < now-iv { // far behind (a stall): resume the cadence from now
				s.next = now + iv
			}
		}
		if s.next < wake {
			wake = s.next
		}
	}
	if math.IsInf(wake, 1) {
		wake = now + g.defInterval
	}
	if g.tick > 0 { // on the shard's grid: the sends of one tick leave together
		wake = math.Ceil(wake/g.tick) * g.tick
	}
	n.due = wake
}

// noteGap records the gap since the heartbeat last created on this opening of the
// link, counted only when the link had granted a lease at both (in slow start the
// node waits for the replica's ack: the replica's time, not the node's).
func (s *hbStream) noteGap(now, iv float64) {
	gen := atomic.LoadUint64(&s.gen)
	leased := atomic.LoadUint64(&s.leasedGen) == gen
	// both ends leased: a heartbeat sent in slow start waits for the replica's ack
	if leased && s.lastLeased && s.lastGen == gen && s.lastAt > 0 {
		gap := now - s.lastAt
		if gap > s.maxGap {
			s.maxGap = gap
		}
		// the next heartbeat was due one interval after the last: the interval
		// declared then, or the one in force now when that is longer
		due := iv
		if s.lastIv > due {
			due = s.lastIv
		}
		if r := gap / due; r > s.maxRatio {
			s.maxRatio, s.gapIv = r, due
		}
	}
	s.lastAt, s.lastGen, s.lastLeased, s.lastIv = now, gen, leased, iv
}

// gaps reports the longest send gaps of each node in ids, per link (one "gaps"
// line per node), from the node's shard: a node is late when a gap is longer
// than its interval allows (bench/scale.py reads the ratio).
func (g *hbGen) gaps(ids []string) {
	for _, id := range ids {
		n, ok := g.byID[id]
		if !ok {
			emit(map[string]interface{}{"ev": "error", "error": "gaps: no node " + id})
			continue
		}
		done := make(chan map[string]interface{})
		n.shard.cmds <- func() {
			links := []interface{}{}
			worst := 0.0
			for _, s := range n.links {
				links = append(links, map[string]interface{}{
					"addr": s.arb.addr, "max_gap_s": s.maxGap, "max_ratio": s.maxRatio,
					"interval_s": s.gapIv,
				})
				if s.maxRatio > worst {
					worst = s.maxRatio
				}
			}
			done <- map[string]interface{}{"ev": "gaps", "node": id, "t": mono(), "max_ratio": worst, "links": links}
		}
		emit(<-done)
	}
}

type nodeHeap []*hbNode

func (h nodeHeap) Len() int            { return len(h) }
func (h nodeHeap) Less(i, j int) bool  { return h[i].due < h[j].due }
func (h nodeHeap) Swap(i, j int)       { h[i], h[j] = h[j], h[i]; h[i].hidx = i; h[j].hidx = j }
func (h *nodeHeap) Push(x interface{}) { n := x.(*hbNode); n.hidx = len(*h); *h = append(*h, n) }
func (h *nodeHeap) Pop() interface{} {
	old := *h
	n := old[len(old)-1]
	*h = old[:len(old)-1]
	return n
}
