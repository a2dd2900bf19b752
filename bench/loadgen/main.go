// Command loadgen is the scale benchmark's load generator (bench/scale.py drives it).
//
// It simulates many nodes, subscribers or etcd lease holders in one process,
// each with real gRPC streams, so that the server is the bottleneck and not
// the load: it reports what it achieved and how late its own sends were.
//
//	loadgen hb   --arbiters h:p,h:p,h:p --prefix n --first 0 --count 5000 [--wait-join] ...
//	loadgen sub  --arbiters h:p,h:p,h:p --count 1000
//	loadgen etcd --endpoints h:p,h:p,h:p --prefix n --first 0 --count 5000 [--ttl 1]
//
// Output: one JSON object per line on stdout ("ev" names its kind): a
// "report" every --report seconds, events ("killed", "joined", "dead", ...)
// as they happen, a "final" report at the end (stdin closed, or SIGTERM).
// Times ("t") are CLOCK_MONOTONIC seconds, the clock of Python's
// time.monotonic() on the same machine.
//
// Commands on stdin, one per line: "kill ID [ID...]" stops those nodes
// abruptly (their streams are cancelled: RST_STREAM, no Leave) and prints
// the kill time; "join [K]" starts the next K nodes (all when K is absent)
// not yet started (with --wait-join none starts before the first "join").
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
)

var outMu sync.Mutex
var out = bufio.NewWriterSize(os.Stdout, 1<<16)

// emit prints one JSON line on stdout (flushed at once: the driver times events on arrival).
func emit(v map[string]interface{}) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"ev":"error","error":%q}`, err.Error()))
	}
	outMu.Lock()
	out.Write(b)
	out.WriteByte('\n')
	out.Flush()
	outMu.Unlock()
}

func fatal(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "loadgen: "+format+"\n", a...)
	os.Exit(2)
}

// cpuSeconds is this process's user + system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)*1e-6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// commander is what a mode does with the stdin commands.
type commander interface {
	kill(ids []string)
	join(k int)
	gaps(ids []string)
	final()
}

func serveCommands(c commander) {
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "kill":
				c.kill(f[1:])
			case "join":
				k := -1
				if len(f) > 1 {
					fmt.Sscan(f[1], &k)
				}
				c.join(k)
			case "gaps":
				c.gaps(f[1:])
			case "quit":
				close(done)
				return
			default:
				emit(map[string]interface{}{"ev": "error", "error": "unknown command " + f[0]})
			}
		}
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-done:
	case <-sig:
	}
	c.final()
}

func main() {
	if len(os.Args) < 2 {
		fatal("usage: loadgen hb|sub|etcd [flags] (see the package comment)")
	}
	if p := os.Getenv("LOADGEN_CPUPROFILE"); p != "" { // a Go CPU profile of the whole run
		f, err := os.Create(p)
		if err != nil {
			fatal("LOADGEN_CPUPROFILE: %v", err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	switch os.Args[1] {
	case "hb":
		runHeartbeats(os.Args[2:])
	case "sub":
		runSubscribers(os.Args[2:])
	case "etcd":
		runEtcd(os.Args[2:])
	default:
		fatal("unknown mode %q: hb, sub or etcd", os.Args[1])
	}
}
