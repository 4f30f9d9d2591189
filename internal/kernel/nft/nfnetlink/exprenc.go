package nfnetlink

import (
	"golang.org/x/sys/unix"
)

// This file encodes the nf_tables expressions kproxy uses, in place into
// a rule message: NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { ... } }
// with the attributes in the order libnftnl (and google/nftables, which
// kproxy used before) writes them; TestLowerWire pins the bytes. Encoding
// them through google/nftables' expr.Marshal allocated a dozen times per
// expression and was about half of a full sync's time at 10k services.

// NAT flags, and an attribute missing from x/sys/unix.
const (
	natRangeProtoSpecified   = unix.NF_NAT_RANGE_PROTO_SPECIFIED
	natRangeProtoRandomFully = unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY
	nftaMasqFlags            = 1 // NFTA_MASQ_FLAGS
)

// exprOpen starts one expression of a rule's list; exprClose ends it.
func (a *attrs) exprOpen(name string) (elem, data int) {
	elem = a.open()
	a.str(unix.NFTA_EXPR_NAME, name)
	return elem, a.open()
}

func (a *attrs) exprClose(elem, data int) {
	a.close(data, unix.NFTA_EXPR_DATA)
	a.close(elem, unix.NFTA_LIST_ELEM)
}

// metaLoad is "meta load KEY => reg REG".
func (a *attrs) metaLoad(key, reg uint32) {
	e, d := a.exprOpen("meta")
	a.u32(unix.NFTA_META_KEY, key)
	a.u32(unix.NFTA_META_DREG, reg)
	a.exprClose(e, d)
}

// metaSet is "meta set KEY with reg REG".
func (a *attrs) metaSet(key, reg uint32) {
	e, d := a.exprOpen("meta")
	a.u32(unix.NFTA_META_KEY, key)
	a.u32(unix.NFTA_META_SREG, reg)
	a.exprClose(e, d)
}

// ctLoad is "ct load KEY => reg REG" (keys without direction).
func (a *attrs) ctLoad(key, reg uint32) {
	e, d := a.exprOpen("ct")
	a.u32(unix.NFTA_CT_KEY, key)
	a.u32(unix.NFTA_CT_DREG, reg)
	a.exprClose(e, d)
}

// cmp is "cmp OP reg REG DATA".
func (a *attrs) cmp(op, reg uint32, data []byte) {
	e, d := a.exprOpen("cmp")
	a.u32(unix.NFTA_CMP_SREG, reg)
	a.u32(unix.NFTA_CMP_OP, op)
	a.value(unix.NFTA_CMP_DATA, data)
	a.exprClose(e, d)
}

// bitwise is "bitwise reg DST = (reg SRC & MASK) ^ XOR".
func (a *attrs) bitwise(src, dst uint32, mask, xor []byte) {
	e, d := a.exprOpen("bitwise")
	a.u32(unix.NFTA_BITWISE_SREG, src)
	a.u32(unix.NFTA_BITWISE_DREG, dst)
	a.u32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
	a.value(unix.NFTA_BITWISE_MASK, mask)
	a.value(unix.NFTA_BITWISE_XOR, xor)
	a.exprClose(e, d)
}

// payloadLoad is "payload load LEN b @ BASE header + OFF => reg REG".
func (a *attrs) payloadLoad(reg, base, off, length uint32) {
	e, d := a.exprOpen("payload")
	a.u32(unix.NFTA_PAYLOAD_DREG, reg)
	a.u32(unix.NFTA_PAYLOAD_BASE, base)
	a.u32(unix.NFTA_PAYLOAD_OFFSET, off)
	a.u32(unix.NFTA_PAYLOAD_LEN, length)
	a.exprClose(e, d)
}

// immediate is "immediate reg REG DATA".
func (a *attrs) immediate(reg uint32, data []byte) {
	e, d := a.exprOpen("immediate")
	a.u32(unix.NFTA_IMMEDIATE_DREG, reg)
	a.value(unix.NFTA_IMMEDIATE_DATA, data)
	a.exprClose(e, d)
}

// verdictExpr is "immediate reg 0 VERDICT [CHAIN]".
func (a *attrs) verdictExpr(code int32, chain string) {
	e, d := a.exprOpen("immediate")
	a.u32(unix.NFTA_IMMEDIATE_DREG, regVerdict)
	imm := a.open()
	v := a.open()
	a.u32(unix.NFTA_VERDICT_CODE, uint32(code))
	if chain != "" {
		a.str(unix.NFTA_VERDICT_CHAIN, chain)
	}
	a.close(v, unix.NFTA_DATA_VERDICT)
	a.close(imm, unix.NFTA_IMMEDIATE_DATA)
	a.exprClose(e, d)
}

// dnat is "nat dnat FAMILY addr_min reg ADDR proto_min reg PROTO" with
// the port range flag nft sets.
func (a *attrs) dnat(family, regAddr, regProto uint32) {
	e, d := a.exprOpen("nat")
	a.u32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
	a.u32(unix.NFTA_NAT_FAMILY, family)
	a.u32(unix.NFTA_NAT_REG_ADDR_MIN, regAddr)
	a.u32(unix.NFTA_NAT_REG_PROTO_MIN, regProto)
	a.u32(unix.NFTA_NAT_FLAGS, natRangeProtoSpecified)
	a.exprClose(e, d)
}

// numgenRandom is "numgen reg REG = random mod MOD".
func (a *attrs) numgenRandom(reg, mod uint32) { a.numgenRandomOffset(reg, mod, 0) }

// numgenRandomOffset is "numgen reg REG = random mod MOD offset OFFSET".
func (a *attrs) numgenRandomOffset(reg, mod, offset uint32) {
	e, d := a.exprOpen("numgen")
	a.u32(unix.NFTA_NG_DREG, reg)
	a.u32(unix.NFTA_NG_MODULUS, mod)
	a.u32(unix.NFTA_NG_TYPE, unix.NFT_NG_RANDOM)
	a.u32(unix.NFTA_NG_OFFSET, offset)
	a.exprClose(e, d)
}

// lookup is "lookup reg SRC set SET [dreg DST] [invert]"; dst < 0 means
// no destination register (a set, not a map).
func (a *attrs) lookup(src uint32, dst int, invert bool, set string, setID uint32) {
	e, d := a.exprOpen("lookup")
	a.u32(unix.NFTA_LOOKUP_SREG, src)
	if dst >= 0 {
		a.u32(unix.NFTA_LOOKUP_DREG, uint32(dst))
	}
	if invert {
		a.u32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
	}
	a.str(unix.NFTA_LOOKUP_SET, set)
	a.u32(unix.NFTA_LOOKUP_SET_ID, setID)
	a.exprClose(e, d)
}

// dynsetUpdate is "dynset update reg_key REG set SET".
func (a *attrs) dynsetUpdate(reg uint32, set string, setID uint32) {
	e, d := a.exprOpen("dynset")
	a.u32(unix.NFTA_DYNSET_SREG_KEY, reg)
	a.u32(unix.NFTA_DYNSET_OP, unix.NFT_DYNSET_OP_UPDATE)
	a.str(unix.NFTA_DYNSET_SET_NAME, set)
	a.u32(unix.NFTA_DYNSET_SET_ID, setID)
	a.u32(unix.NFTA_DYNSET_FLAGS, 0)
	a.exprClose(e, d)
}

// masqFullyRandom is "masq flags fully-random".
func (a *attrs) masqFullyRandom() {
	e, d := a.exprOpen("masq")
	a.u32(nftaMasqFlags, natRangeProtoRandomFully)
	a.exprClose(e, d)
}

// reject is "reject type TYPE code CODE".
func (a *attrs) reject(typ uint32, code uint8) {
	e, d := a.exprOpen("reject")
	a.u32(unix.NFTA_REJECT_TYPE, typ)
	a.put(unix.NFTA_REJECT_ICMP_CODE, []byte{code})
	a.exprClose(e, d)
}

// counter is "counter packets 0 bytes 0".
func (a *attrs) counter() {
	e, d := a.exprOpen("counter")
	a.u64(unix.NFTA_COUNTER_BYTES, 0)
	a.u64(unix.NFTA_COUNTER_PACKETS, 0)
	a.exprClose(e, d)
}

// fib is "fib FLAGS => reg REG RESULT" (flags saddr or daddr).
func (a *attrs) fib(reg, flags, result uint32) {
	e, d := a.exprOpen("fib")
	a.u32(unix.NFTA_FIB_DREG, reg)
	if flags != 0 {
		a.u32(unix.NFTA_FIB_FLAGS, flags)
	}
	if result != 0 {
		a.u32(unix.NFTA_FIB_RESULT, result)
	}
	a.exprClose(e, d)
}
