package ipset

import (
	"errors"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func TestParseHeader(t *testing.T) {
	msg := (&nl.Nfgenmsg{NfgenFamily: unix.AF_INET6, Version: nl.NFNETLINK_V0}).Serialize()
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)),
		nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated("KUBE-6-CLUSTER-IP")),
		nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated("hash:ip,port")),
		nl.NewRtAttr(nl.IPSET_ATTR_REVISION, nl.Uint8Attr(5)),
		nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(unix.AF_INET6)),
	} {
		msg = append(msg, a.Serialize()...)
	}
	s, ok := parseHeader(msg)
	if !ok || s != (Set{Name: "KUBE-6-CLUSTER-IP", Type: "hash:ip,port", IPv6: true}) {
		t.Errorf("parseHeader = %+v, %v", s, ok)
	}
	if _, ok := parseHeader(msg[:2]); ok {
		t.Error("a short message parsed")
	}
}

func TestKernelErr(t *testing.T) {
	for _, c := range []struct {
		err   error
		exist error
		want  error
	}{
		{syscall.ENOENT, nil, ErrNoSet},
		{syscall.Errno(nl.IPSET_ERR_EXIST), ErrEntryExists, ErrEntryExists},
		{nl.IPSetError(nl.IPSET_ERR_EXIST), ErrNoEntry, ErrNoEntry},
		{nl.IPSetError(nl.IPSET_ERR_BUSY), nil, ErrInUse},
		{syscall.Errno(nl.IPSET_ERR_EXIST_SETNAME2), nil, ErrSetExists},
		{syscall.Errno(nl.IPSET_ERR_INVALID_CIDR), nil, ErrBadEntry},
	} {
		got := kernelErr(c.err, c.exist)
		if !errors.Is(got, c.want) {
			t.Errorf("kernelErr(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	other := errors.New("other")
	if got := kernelErr(other, nil); got != other {
		t.Errorf("kernelErr(other) = %v", got)
	}
}
