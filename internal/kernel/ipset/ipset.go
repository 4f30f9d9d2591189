// Package ipset reads and changes the kernel's ipsets (netfilter's IP
// sets) of one network namespace, for ipvs mode. The proxier diffs the
// members it wants against what Entries lists and adds or deletes only
// the difference. Entries use ipset's own text form, as upstream
// kube-proxy writes them, so `ipset list` output and upstream's names
// read the same: "198.19.0.1,tcp:80" (hash:ip,port),
// "198.19.0.1,tcp:80,198.18.0.0/24" (hash:ip,port,net),
// "198.19.0.1,tcp:80,198.18.0.5" (hash:ip,port,ip), "198.18.0.0/24"
// (hash:net), "tcp:30080"-style ports for bitmap:port ("30080").
package ipset

// Set describes one set to create.
type Set struct {
	Name string
	// Type is the ipset type: "hash:ip", "hash:ip,port", "hash:ip,port,ip",
	// "hash:ip,port,net", "hash:net", "bitmap:port".
	Type string
	// IPv6 selects family inet6 (hash types only).
	IPv6    bool
	Comment string
}

// Handle reads and changes ipsets in one network namespace.
type Handle interface {
	// Sets lists the names of every set in the namespace.
	Sets() ([]string, error)
	// Create creates the set; a set of that name and type that exists
	// already is not an error, one of another type is.
	Create(Set) error
	Destroy(name string) error
	// Entries lists a set's members in the text form above.
	Entries(name string) ([]string, error)
	Add(name, entry string) error
	Del(name, entry string) error
	Close()
}
