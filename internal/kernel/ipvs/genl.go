package ipvs

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// IPVS generic netlink, from include/uapi/linux/ip_vs.h.
const (
	ipvsGenlName    = "IPVS"
	ipvsGenlVersion = 1

	ipvsCmdDelService = 3 // IPVS_CMD_DEL_SERVICE
	ipvsCmdGetService = 4 // IPVS_CMD_GET_SERVICE

	ipvsCmdAttrService = 1 // IPVS_CMD_ATTR_SERVICE, nested

	ipvsSvcAttrAF       = 1 // u16
	ipvsSvcAttrProtocol = 2 // u16
	ipvsSvcAttrAddr     = 3 // union nf_inet_addr, 16 bytes
	ipvsSvcAttrPort     = 4 // be16
	ipvsSvcAttrFWMark   = 5 // u32
)

// parseServiceMessage reads one IPVS_CMD_NEW_SERVICE message of a dump
// (generic netlink header, then attributes). ok is false for a message
// without a service.
func parseServiceMessage(msg []byte) (vs VirtualServer, ok bool, err error) {
	if len(msg) < nl.SizeofGenlmsg {
		return vs, false, fmt.Errorf("message of %d bytes is too short", len(msg))
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofGenlmsg:])
	if err != nil {
		return vs, false, err
	}
	for _, a := range attrs {
		if a.Attr.Type&nl.NLA_TYPE_MASK != ipvsCmdAttrService {
			continue
		}
		vs, err = parseService(a.Value)
		return vs, err == nil, err
	}
	return vs, false, nil
}

func parseService(b []byte) (VirtualServer, error) {
	var vs VirtualServer
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return vs, err
	}
	var addr []byte
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type & nl.NLA_TYPE_MASK {
		case ipvsSvcAttrAF:
			if len(v) < 2 {
				return vs, fmt.Errorf("short address family attribute")
			}
			vs.Family = nl.NativeEndian().Uint16(v)
		case ipvsSvcAttrProtocol:
			if len(v) < 2 {
				return vs, fmt.Errorf("short protocol attribute")
			}
			vs.Protocol = nl.NativeEndian().Uint16(v)
		case ipvsSvcAttrAddr:
			addr = v
		case ipvsSvcAttrPort:
			if len(v) < 2 {
				return vs, fmt.Errorf("short port attribute")
			}
			vs.Port = binary.BigEndian.Uint16(v)
		case ipvsSvcAttrFWMark:
			if len(v) < 4 {
				return vs, fmt.Errorf("short fwmark attribute")
			}
			vs.FWMark = nl.NativeEndian().Uint32(v)
		}
	}
	// The kernel always sends the 16 bytes of the address union; an IPv4
	// address is its first 4.
	switch {
	case vs.FWMark != 0:
	case vs.Family == unix.AF_INET && len(addr) >= 4:
		vs.Addr = netip.AddrFrom4([4]byte(addr[:4]))
	case vs.Family == unix.AF_INET6 && len(addr) >= 16:
		vs.Addr = netip.AddrFrom16([16]byte(addr[:16]))
	default:
		return vs, fmt.Errorf("address of %d bytes for family %d", len(addr), vs.Family)
	}
	return vs, nil
}

// serviceAttr is the IPVS_CMD_ATTR_SERVICE attribute naming one virtual
// server for IPVS_CMD_DEL_SERVICE: the family and either the firewall
// mark or protocol, address and port (the kernel looks it up by these).
func serviceAttr(vs VirtualServer) *nl.RtAttr {
	svc := nl.NewRtAttr(ipvsCmdAttrService, nil)
	family := vs.Family
	if family == 0 {
		family = unix.AF_INET6
		if vs.Addr.Is4() {
			family = unix.AF_INET
		}
	}
	svc.AddRtAttr(ipvsSvcAttrAF, nl.Uint16Attr(family))
	if vs.FWMark != 0 {
		svc.AddRtAttr(ipvsSvcAttrFWMark, nl.Uint32Attr(vs.FWMark))
		return svc
	}
	svc.AddRtAttr(ipvsSvcAttrProtocol, nl.Uint16Attr(vs.Protocol))
	addr := vs.Addr.As16()
	if vs.Addr.Is4() {
		a4 := vs.Addr.As4()
		addr = [16]byte{}
		copy(addr[:], a4[:])
	}
	svc.AddRtAttr(ipvsSvcAttrAddr, addr[:])
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, vs.Port)
	svc.AddRtAttr(ipvsSvcAttrPort, port)
	return svc
}
