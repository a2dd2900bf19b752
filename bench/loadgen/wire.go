// Wire helpers: a raw-bytes gRPC codec and hand-encoded protobuf messages.
//
// The load generator needs no generated code (no protoc-gen-go version to
// match): every request is appended field by field with protowire and every
// response is read the same way. Field numbers are those of
// protos/membership/v1/membership.proto and of etcd's rpc.proto / kv.proto.
package main

import (
	"fmt"
	"math"
	"syscall"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec passes []byte through: Marshal takes []byte or *[]byte, Unmarshal fills *[]byte.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	case *[]byte:
		return *b, nil
	}
	return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*p = append((*p)[:0], data...)
	return nil
}

// mono is CLOCK_MONOTONIC in seconds: the clock of Python's time.monotonic(),
// so the driver can compare our kill times with its own and other processes'.
func mono() float64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	return float64(ts.Sec) + float64(ts.Nsec)*1e-9
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}

// field is one decoded field: its number, type, and value (varint or fixed64 in u, bytes in b).
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64
	b   []byte
}

// eachField calls fn for every field of msg; it returns an error on malformed input.
func eachField(msg []byte, fn func(f field)) error {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return protowire.ParseError(n)
		}
		msg = msg[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(msg)
		case protowire.Fixed64Type:
			f.u, n = protowire.ConsumeFixed64(msg)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(msg)
		default:
			n = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		msg = msg[n:]
		fn(f)
	}
	return nil
}

// MemberState of membership.v1.
var stateNames = []string{"UNSPECIFIED", "JOINING", "ALIVE", "DEAD", "LEFT"}

func stateName(s uint64) string {
	if s < uint64(len(stateNames)) {
		return stateNames[s]
	}
	return fmt.Sprintf("STATE_%d", s)
}

// ack is the part of a membership.v1.HeartbeatAck the load generator uses.
type ack struct {
	seq, epoch, incarnation uint64
	nextInterval, lease     float64
	state                   uint64
	inQuorum                bool
}

func decodeAck(msg []byte) (a ack, err error) {
	err = eachField(msg, func(f field) {
		switch f.num {
		case 1:
			a.seq = f.u
		case 2:
			a.epoch = f.u
		case 3:
			a.lease = math.Float64frombits(f.u)
		case 4:
			a.nextInterval = math.Float64frombits(f.u)
		case 5:
			a.state = f.u
		case 6:
			a.inQuorum = f.u != 0
		case 8:
			a.incarnation = f.u
		}
	})
	return
}
