package main

// The heartbeat mode's reports: one JSON line a second, and a final one.

import (
	"math"
	"sync/atomic"
	"time"
)

func (g *hbGen) snapshot(final bool) map[string]interface{} {
	now := mono()
	window := g.reportEvery
	arbs := []interface{}{}
	var sentTot, reqTot float64
	lc, lm := g.late.take()
	g.lateTotal.merge(lc, lm)
	var lw summary
	lw.merge(lc, lm)
	live, started := 0, 0
	for i, a := range g.arbs {
		states := map[string]int{}
		required := 0.0
		waiting := 0
		for _, n := range g.nodes {
			if atomic.LoadInt32(&n.started) == 0 {
				continue
			}
			if i == 0 {
				started++
			}
			if atomic.LoadInt32(&n.stopped) == 1 {
				continue
			}
			if i == 0 {
				live++
			}
			s := n.links[i]
			states[stateName(uint64(atomic.LoadUint32(&s.state)))]++
			if s.waiting() { // slow start: nothing more is required before the ack
				waiting++
				continue
			}
			iv, _ := g.intervalOf(n, s)
			required += 1 / iv
		}
		sent, acks := atomic.LoadUint64(&a.sent), atomic.LoadUint64(&a.acks)
		c, m := a.lat.take()
		a.latTotal.merge(c, m)
		var w summary
		w.merge(c, m)
		a.mu.Lock()
		errs := map[string]int{}
		for k, v := range a.errs {
			errs[k] = v
		}
		a.mu.Unlock()
		ep := atomic.LoadUint64(&a.epoch)
		row := map[string]interface{}{
			"addr": a.addr, "sent": sent, "acks": acks, "epoch": ep, "states": states,
			"errors": errs, "required_rate": math.Round(required*10) / 10,
			"stale": atomic.LoadUint64(&a.stale), "slow_start_waiting": waiting,
		}
		if final {
			row["ack_ms"] = a.latTotal.ms()
			el := now - g.t0
			row["sent_rate"] = math.Round(float64(sent)/el*10) / 10
		} else {
			row["ack_ms"] = w.ms()
			row["sent_rate"] = math.Round(float64(sent-a.lastSent)/window*10) / 10
			row["ack_rate"] = math.Round(float64(acks-a.lastAcks)/window*10) / 10
			sentTot += float64(sent-a.lastSent) / window
		}
		reqTot += required
		a.lastSent, a.lastAcks = sent, acks
		arbs = append(arbs, row)
	}
	r := map[string]interface{}{
		"ev": "report", "t": now, "started": started, "live": live, "arbiters": arbs,
		"required_rate": math.Round(reqTot*10) / 10, "sent_rate": math.Round(sentTot*10) / 10,
		"late_ms": lw.ms(), "cpu_s": cpuSeconds() - g.cpu0, "elapsed_s": now - g.t0,
		"rejoins": atomic.LoadUint64(&g.rejoins), "lefts": atomic.LoadUint64(&g.lefts),
	}
	if final {
		r["ev"] = "final"
		r["late_ms"] = g.lateTotal.ms()
	}
	return r
}

func (g *hbGen) reporter() {
	for {
		time.Sleep(time.Duration(g.reportEvery * 1e9))
		emit(g.snapshot(false))
	}
}

func (g *hbGen) final() {
	emit(g.snapshot(true))
}
