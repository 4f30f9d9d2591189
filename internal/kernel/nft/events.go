package nft

import "context"

// Change notifications of nf_tables (what `nft monitor` prints), as the
// drift monitor reads them. nfnetlink.Monitor listens to the kernel;
// nfttest.Watcher is driven by tests.

// ObjKind is the kind of object a change notification is about.
type ObjKind string

// Kinds of objects (also the values of the kind label of
// kproxy_rules_drift_total).
const (
	KindTable   ObjKind = "table"
	KindChain   ObjKind = "chain"
	KindRule    ObjKind = "rule"
	KindSet     ObjKind = "set"
	KindMap     ObjKind = "map"
	KindElement ObjKind = "element"
	// KindUnknown: notifications were lost (the receive buffer
	// overflowed), so what changed is not known.
	KindUnknown ObjKind = "unknown"
)

// Event is one nf_tables change notification, or the news that some were
// lost.
type Event struct {
	// Lost: the kernel dropped notifications (ENOBUFS); the other fields
	// are empty and anything may have changed.
	Lost   bool
	Family Family // "ip", "ip6", "inet", "arp", "bridge", "netdev"
	Kind   ObjKind
	// Deleted: a deletion (DEL* message); otherwise an addition or
	// replacement (NEW* message).
	Deleted bool
	Table   string
	// Name is the object's name within the table: the chain (for rules
	// the chain they are in), the set or map (for elements the set they
	// are in). Empty for tables.
	Name string
	// Count is the number of objects: the elements of an element
	// notification, 1 otherwise.
	Count int
	// PortID is the netlink port id of the socket whose transaction
	// caused the change.
	PortID uint32
}

// Watcher delivers nf_tables change notifications. Monitor listens to the
// kernel; nfttest.Watcher is driven by tests.
type Watcher interface {
	// Watch calls fn with the events of each batch of notifications as
	// they arrive, until ctx ends (then it returns nil) or the socket
	// fails. Lost notifications are reported as an Event with Lost set.
	Watch(ctx context.Context, fn func([]Event)) error
	Close() error
}
