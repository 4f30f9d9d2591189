// Package nftables is kproxy's --proxy-mode nftables: native nf_tables
// tables (ip/ip6 "kube-proxy" and its shard tables "kube-proxy-sN") with
// upstream kube-proxy's names for maps and chains, written in one netlink
// transaction per sync through nft.Interface.
//
// Render is pure: (Config, Input, Applied) → Plan. It reads no clock and
// runs nothing; the Plan holds the transaction (Tx), an optional clean-up
// transaction applied after it, the conntrack work, and how Applied
// changes. Proxier.Sync is the only side effect: it lists our tables
// before a full sync, renders, applies, and only once the kernel accepted
// Tx calls Plan.Commit (and CommitCleanup after Cleanup), so Applied is
// always what the kernel holds. A partial sync renders only the changed
// service ports and emits the difference to what Applied says they have.
//
// Where things are:
//
//   - render.go: Config, Input, Render and the renderer; slabs.
//   - applied.go: Applied, Plan, Commit/CommitCleanup, the per-sync tallies.
//   - layout.go: the fixed sets, chains and rules of the main and shard
//     tables (writeFixed), and takeover of tables another layout wrote.
//   - sync.go: full sync (everything rewritten, leftovers made stale),
//     partial sync and its clean-up transaction.
//   - stale.go: objects no longer used: flushed, deleted staleDelay later.
//   - elements.go: element ownership (several service ports may want one
//     key; the first owner's value is in the kernel), hairpin counts, and
//     the element diff (flushElements).
//   - service.go: one service port's chains, rules and elements (describe,
//     after upstream's proxier) and what changes of them (renderService).
//   - epmap.go: endpoint choice: endpoint maps and their key allocator.
//   - plain.go: plain ClusterIP ports (no chain of their own), shared
//     chains and the tiers of their maps.
//   - names.go, options.go, drift.go, proxier.go: names, shard choice and
//     limits; options; noticing changes made by others; applying.
//   - repair.go: re-creating the tables others changed from Applied, in
//     a transaction on those tables alone (RenderRepair).
//
// Applied's bookkeeping is in groups (staleObjects, hairpinState,
// endpointMapState, plainPortState, tallies), each defined beside the code
// that renders it, each with its Plan counterpart and commit.
//
// Where the layout departs from upstream, it is for a cost measured in
// docs/benchmarks.md ("Where the time goes: nftables"):
//
//   - No per-endpoint chains and no inline numgen vmaps: an anonymous set
//     per service makes the kernel's loop check quadratic, and the kernel
//     validates every chain of a table on each commit that adds a jump or
//     NAT rule. Policy chains DNAT directly; hairpin traffic is marked in
//     postrouting through sets of "ep . ep" pairs.
//   - The hairpin pairs are in the shard tables, spread by address
//     (hairpinShard), each shard with a nat-postrouting chain that marks
//     them: the main table then holds nothing that grows with the
//     endpoints, and a repair of it (repair.go) writes ~10k elements at
//     10k services instead of ~75k. A new connection passes one more nat
//     chain per shard in postrouting.
//   - Partial syncs delete nothing on the common path: every deleting
//     transaction waits for an RCU grace period, ~15 ms. Changed
//     chains get their new rules inserted at the head, closed by return;
//     shadowed rules, garbage elements and stale objects go in a clean-up
//     transaction at least staleDelay later (stale.go, sync.go).
//   - Shard tables, so that a change makes the kernel validate one shard,
//     not the whole ruleset (chooseShards, ShardOf).
//   - Endpoint maps: one "dnat to numgen random mod N offset O map" rule
//     per policy chain instead of a rule per endpoint, since the kernel's
//     share of a full sync is per expression parsed (epmap.go).
//     Endpoint map keys are not owned elements: the allocator gives each
//     key one owner, and owning them made a 10k render 60 % slower.
//   - Plain ClusterIP ports have no chain: every commit walks every chain
//     of the netns. Their changes go into a higher tier of maps
//     (adds only) and are settled by a clean-up (plain.go).
//   - Hairpin pairs are counted per address, not owned: as owned elements
//     they would be most of the renderer's memory.
//   - Render's allocations: names hashed once per port, element keys cut
//     from one string, per-port chunks for elements, rules and
//     statements; a full sync's kept state carved from slabs.
//
// The benchmarks are in test/bench (BenchmarkNFTablesFullSync,
// BenchmarkNFTablesEndpointChange, BenchmarkNFTablesEndpointVariants,
// BenchmarkNFTablesRender, BenchmarkNFTablesDataPlane); the commands are
// in docs/benchmarks.md.
package nftables
