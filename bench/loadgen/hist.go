package main

import (
	"math"
	"sync/atomic"
)

// hist is a lock-free log-bucketed histogram of durations in seconds: bucket
// k holds values in [1us * 1.02^k, 1us * 1.02^(k+1)), so a percentile is
// exact to 2 %. Values under 1 us go to bucket 0, over ~1000 s to the last.
type hist struct {
	b   [1200]uint64
	max uint64 // math.Float64bits of the largest value (positive floats order as their bits)
}

var logStep = math.Log(1.02)

func (h *hist) add(v float64) {
	k := 0
	if v > 1e-6 {
		k = int(math.Log(v/1e-6) / logStep)
		if k >= len(h.b) {
			k = len(h.b) - 1
		}
	}
	atomic.AddUint64(&h.b[k], 1)
	bits := math.Float64bits(math.Max(v, 0))
	for {
		old := atomic.LoadUint64(&h.max)
		if bits <= old || atomic.CompareAndSwapUint64(&h.max, old, bits) {
			break
		}
	}
}

// snapshot returns the counts and max and resets the histogram (a report window).
func (h *hist) take() (counts [1200]uint64, max float64) {
	for i := range h.b {
		counts[i] = atomic.SwapUint64(&h.b[i], 0)
	}
	max = math.Float64frombits(atomic.SwapUint64(&h.max, 0))
	return
}

// summary is p50/p99/max in milliseconds of a histogram window, merged into a running total.
type summary struct {
	counts [1200]uint64
	max    float64
}

func (s *summary) merge(c [1200]uint64, m float64) {
	for i := range c {
		s.counts[i] += c[i]
	}
	if m > s.max {
		s.max = m
	}
}

func (s *summary) n() uint64 {
	var t uint64
	for _, c := range s.counts {
		t += c
	}
	return t
}

func (s *summary) quantile(q float64) float64 {
	total := s.n()
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	if rank == 0 {
		rank = 1
	}
	var acc uint64
	for k, c := range s.counts {
		acc += c
		if acc >= rank {
			// the bucket's geometric middle
			return 1e-6 * math.Pow(1.02, float64(k)+0.5)
		}
	}
	return s.max
}

func (s *summary) ms() map[string]float64 {
	r := func(v float64) float64 { return math.Round(v*1e6) / 1e3 }
	return map[string]float64{"p50": r(s.quantile(0.5)), "p99": r(s.quantile(0.99)), "max": r(s.max), "n": float64(s.n())}
}
