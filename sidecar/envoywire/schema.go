package envoywire

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A schema is what the walker knows of a message type: for each field number, how its
// value is read. It is compiled once from the message's descriptor, so that a walk of a
// message accepts exactly what proto.Unmarshal accepts of it, and refuses what it refuses:
// malformed wire format, strings that are not UTF-8 (proto3), nesting deeper than the
// recursion limit. A field on the path to a value the decision reads carries a capture
// id; the walker reports its values to a captor.
type schema struct {
	name   protoreflect.FullName
	fields []field // by number
}

type field struct {
	kind kind
	// msg is a message field's message, or a map's value message (nil for scalars).
	msg *schema
	// key and val are a map's key and value kinds.
	key, val kind
	capture  capture
}

type kind uint8

const (
	kNone    kind = iota // not a field of the message: an unknown field
	kVarint              // int32, int64, uint32, uint64, sint32, sint64, bool, enum
	kFixed32             // fixed32, sfixed32, float
	kFixed64             // fixed64, sfixed64, double
	kBytes               // bytes, or a string without UTF-8 validation
	kString              // a string that must be UTF-8
	kMessage
	kMap
)

// capture names a captured field; 0 is none.
type capture uint8

// captor receives the captured values of a walk, in wire order. Their bytes alias the
// message, and are valid only during the walk.
type captor interface {
	// scalar is a captured varint (x) or string or bytes field (v).
	scalar(id capture, v []byte, x uint64)
	// enter and leave bracket a captured message field.
	enter(id capture)
	leave(id capture)
	// entry is one entry of a captured map, with its key and value as decoded (the last
	// of each, empty when absent).
	entry(id capture, k, v []byte)
}

func (s *schema) field(num protowire.Number) *field {
	if int(num) < len(s.fields) {
		return &s.fields[num]
	}
	return &noField
}

var noField field

// compile compiles md's schema, with the captures given by their dotted paths of field
// names from md (e.g. "attributes.request.http.path"). Messages on no capture's path
// are compiled once and shared.
func compile(md protoreflect.MessageDescriptor, captures map[string]capture) *schema {
	own := map[*schema]bool{}
	root := clone(compileShared(md, map[protoreflect.FullName]*schema{}), own)
	for path, id := range captures {
		s, d := root, md
		names := strings.Split(path, ".")
		for i, name := range names {
			fd := d.Fields().ByName(protoreflect.Name(name))
			if fd == nil {
				panic(fmt.Sprintf("envoywire: %s: %s has no field %s", path, d.FullName(), name))
			}
			f := &s.fields[fd.Number()]
			if i == len(names)-1 {
				f.capture = id
				break
			}
			if f.msg == nil {
				panic(fmt.Sprintf("envoywire: %s: %s is not a message", path, name))
			}
			if !own[f.msg] {
				f.msg = clone(f.msg, own)
			}
			s, d = f.msg, fd.Message()
			if fd.IsMap() {
				d = fd.MapValue().Message()
			}
		}
	}
	return root
}

func clone(s *schema, own map[*schema]bool) *schema {
	c := &schema{name: s.name, fields: append([]field(nil), s.fields...)}
	own[c] = true
	return c
}

// compileShared compiles md and the messages it holds, reusing those compiled already
// (messages may be recursive: google.protobuf.Struct).
func compileShared(md protoreflect.MessageDescriptor, shared map[protoreflect.FullName]*schema) *schema {
	if s, ok := shared[md.FullName()]; ok {
		return s
	}
	s := &schema{name: md.FullName()}
	shared[md.FullName()] = s
	fds := md.Fields()
	maxNum := protoreflect.FieldNumber(0)
	for i := 0; i < fds.Len(); i++ {
		maxNum = max(maxNum, fds.Get(i).Number())
	}
	if maxNum > 1024 {
		panic(fmt.Sprintf("envoywire: %s: field numbers up to %d are not supported", md.FullName(), maxNum))
	}
	s.fields = make([]field, maxNum+1)
	for i := 0; i < fds.Len(); i++ {
		fd := fds.Get(i)
		f := &s.fields[fd.Number()]
		switch {
		case fd.IsMap():
			f.kind = kMap
			f.key, f.val = scalarKind(fd, fd.MapKey()), scalarKind(fd, fd.MapValue())
			if m := fd.MapValue().Message(); m != nil {
				f.val, f.msg = kMessage, compileShared(m, shared)
			}
		case fd.Kind() == protoreflect.GroupKind:
			panic(fmt.Sprintf("envoywire: %s: groups are not supported", fd.FullName()))
		case fd.Message() != nil:
			f.kind, f.msg = kMessage, compileShared(fd.Message(), shared)
		default:
			f.kind = scalarKind(fd, fd)
			if fd.IsList() && f.kind != kBytes && f.kind != kString {
				// They may come packed, which the walker does not check.
				panic(fmt.Sprintf("envoywire: %s: repeated scalars are not supported", fd.FullName()))
			}
		}
	}
	return s
}

// scalarKind is how a scalar value of kd is read; fd, the field, decides whether its
// strings must be UTF-8 (as proto.Unmarshal decides it).
func scalarKind(fd, kd protoreflect.FieldDescriptor) kind {
	switch kd.Kind() {
	case protoreflect.StringKind:
		if enforceUTF8(fd) {
			return kString
		}
		return kBytes
	case protoreflect.BytesKind:
		return kBytes
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return kFixed32
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return kFixed64
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return kMessage
	}
	return kVarint
}

// enforceUTF8 reports whether proto.Unmarshal refuses a string field of fd that is not
// UTF-8: always in proto3, by the field's feature in editions.
func enforceUTF8(fd protoreflect.FieldDescriptor) bool {
	if fd.Syntax() == protoreflect.Editions {
		if f, ok := fd.(interface{ EnforceUTF8() bool }); ok {
			return f.EnforceUTF8()
		}
	}
	return fd.Syntax() == protoreflect.Proto3
}

// walk reads message b of schema s and reports whether proto.Unmarshal would accept it;
// depth is what is left of the recursion limit (protowire.DefaultRecursionLimit for a
// whole message). Captured values go to c as they come; when walk reports false, what it
// reported is to be thrown away.
//
// The checks are proto.Unmarshal's: every tag, varint and length well-formed, field
// numbers from 1 to 2^29-1, no wire types 6 and 7 and no stray end-group, groups of
// unknown fields balanced, strings of proto3 fields valid
// UTF-8 (map keys and values too), every known message field and map entry read the same
// way, and no more nesting than the limit, each message and each map entry one level (a
// map's level is taken before its wire type is looked at, as proto.Unmarshal does). A
// known field with another wire type than its own is an unknown field, as there.
func walk(b []byte, s *schema, depth int, c captor) bool {
	if depth--; depth < 0 {
		return false
	}
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return false
		}
		b = b[n:]
		f := s.field(num)
		if f.kind == kMap && depth-1 < 0 {
			return false
		}
		switch typ {
		case protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			if f.capture != 0 && f.kind == kVarint {
				c.scalar(f.capture, nil, x)
			}
		case protowire.Fixed32Type:
			if len(b) < 4 {
				return false
			}
			b = b[4:]
		case protowire.Fixed64Type:
			if len(b) < 8 {
				return false
			}
			b = b[8:]
		case protowire.BytesType:
			v, n := consumeBytes(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			switch f.kind {
			case kString:
				if !utf8.Valid(v) {
					return false
				}
				fallthrough
			case kBytes:
				if f.capture != 0 {
					c.scalar(f.capture, v, 0)
				}
			case kMessage:
				if f.capture != 0 {
					c.enter(f.capture)
				}
				if !walk(v, f.msg, depth, c) {
					return false
				}
				if f.capture != 0 {
					c.leave(f.capture)
				}
			case kMap:
				if !walkEntry(v, f, depth-1, c) {
					return false
				}
			}
		case protowire.StartGroupType:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
		default: // an end-group outside a group, or wire types 6 and 7
			return false
		}
	}
	return true
}

// walkEntry reads one map entry of field f: key (1) and value (2), the last of each,
// other fields and other wire types skipped as unknown.
func walkEntry(b []byte, f *field, depth int, c captor) bool {
	var k, v []byte
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return false
		}
		b = b[n:]
		want := kNone
		switch num {
		case 1:
			want = f.key
		case 2:
			want = f.val
		}
		if typ != protowire.BytesType || (want != kString && want != kBytes && want != kMessage) {
			// Another field, or a scalar key or value (not captured): read as unknown.
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
			continue
		}
		x, n := consumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch want {
		case kString:
			if !utf8.Valid(x) {
				return false
			}
		case kMessage:
			if !walk(x, f.msg, depth, c) {
				return false
			}
		}
		if num == 1 {
			k = x
		} else {
			v = x
		}
	}
	if f.capture != 0 {
		c.entry(f.capture, k, v)
	}
	return true
}

// consumeTag is protowire.ConsumeTag, with the one-byte tags of field numbers up to 15
// read inline.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	if len(b) > 0 && b[0] < 0x80 && b[0] >= 1<<3 {
		return protowire.Number(b[0] >> 3), protowire.Type(b[0] & 7), 1
	}
	return protowire.ConsumeTag(b)
}

// consumeBytes is protowire.ConsumeBytes, with lengths under 128 read inline.
func consumeBytes(b []byte) ([]byte, int) {
	if len(b) > 0 && b[0] < 0x80 {
		n := 1 + int(b[0])
		if n > len(b) {
			return nil, -1
		}
		return b[1:n], n
	}
	return protowire.ConsumeBytes(b)
}
