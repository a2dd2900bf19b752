package main

// The etcd mode's watcher: one Watch on the /bench/ prefix, from revision 1.

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// watch prints a "deleted" line for each DELETE under prefix, with the lease
// the key was under (from the PUT events before it); a watch that ends is
// reopened from the revision after the last one seen.
func (g *etcdGen) watch(conn *grpc.ClientConn, prefix string) {
	end := []byte(prefix)
	end[len(end)-1]++
	owner := map[string]int64{}
	var rev int64
	for {
		ctx, cancel := context.WithCancel(context.Background())
		if err := g.watchOnce(ctx, conn, prefix, end, rev+1, owner, &rev); err != nil {
			g.noteErr(err)
		}
		cancel()
		time.Sleep(time.Duration(retryConnWait * 1e9))
	}
}

func (g *etcdGen) watchOnce(ctx context.Context, conn *grpc.ClientConn, prefix string, end []byte,
	start int64, owner map[string]int64, rev *int64) error {
	st, err := conn.NewStream(ctx, etcdStream, "/etcdserverpb.Watch/Watch")
	if err != nil {
		return err
	}
	create := appendBytes(nil, 1, []byte(prefix))
	create = appendBytes(create, 2, end)
	create = appendVarint(create, 3, uint64(start))
	if err := st.SendMsg(appendBytes(nil, 1, create)); err != nil {
		return err
	}
	var buf []byte
	for {
		if err := st.RecvMsg(&buf); err != nil {
			return err
		}
		t := mono()
		eachField(buf, func(f field) {
			if f.num != 11 { // events
				return
			}
			var typ uint64
			var key string
			var lease, mod int64
			eachField(f.b, func(e field) {
				switch e.num {
				case 1:
					typ = e.u
				case 2:
					eachField(e.b, func(kv field) {
						switch kv.num {
						case 1:
							key = string(kv.b)
						case 3:
							mod = int64(kv.u)
						case 6:
							lease = int64(kv.u)
						}
					})
				}
			})
			if mod > *rev {
				*rev = mod
			}
			if typ == 0 {
				owner[key] = lease
				return
			}
			emit(map[string]interface{}{"ev": "deleted", "node": strings.TrimPrefix(key, prefix),
				"lease": owner[key], "t": t})
			delete(owner, key)
		})
	}
}
