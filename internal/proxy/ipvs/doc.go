// Package ipvs is --proxy-mode ipvs: upstream kube-proxy's IPVS layout
// (kube-ipvs0, IPVS virtual servers, its ipsets and iptables chains).
//
// Render is pure: (Config, State, Node, Host) → Plan, everything one
// family wants in the kernel. Proxier.Sync is the only side effect: it
// diffs a Plan against what it last applied (read from the kernel at full
// syncs and after a failure) and changes only the difference. A partial
// sync renders only the changed service ports (PartialRenderer) and
// applies the PartialPlan, what appears or goes, so that its cost
// follows the change.
//
// Where things are:
//
//   - render.go: Config, Host, Render and the renderer.
//   - service.go: one service port's share: its virtual servers with
//     their real servers, set members and kube-ipvs0 addresses.
//   - sync.go: full and partial syncs: the composer, which counts every
//     service port's share, so that a partial sync re-renders only the
//     changed ones; Renderer, PartialRenderer and FullRenderer.
//   - render_iptables.go: the iptables-restore input of upstream's chains.
//   - applied.go: Plan, PartialPlan, what the proxier knows the kernel
//     holds (applied), and a Plan's text form.
//   - names.go: kube-ipvs0, tables, chains, jump rules and ipsets with
//     upstream's names.
//   - proxier.go, apply.go: syncing, reading the kernel and the ownership
//     of virtual servers; applying a Plan or PartialPlan step by step.
//   - graceful.go: graceful termination of removed real servers.
package ipvs
