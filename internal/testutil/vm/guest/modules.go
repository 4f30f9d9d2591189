package guest

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// Modules is a kernel's module index: depmod's modules.dep (each module's
// path relative to lib/modules/<release>, and the paths of every module it
// needs, transitively) and modules.builtin (modules compiled into the
// kernel, which are never loaded).
type Modules struct {
	path    map[string]string   // name -> relative path
	deps    map[string][]string // name -> names of its dependencies
	builtin map[string]bool
}

// ModuleName is the kernel's name of a module file: the base name without
// .ko (and a compression suffix), with '-' folded to '_' as the kernel does.
func ModuleName(p string) string {
	b := path.Base(p)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		b = strings.TrimSuffix(b, ext)
	}
	b = strings.TrimSuffix(b, ".ko")
	return strings.ReplaceAll(b, "-", "_")
}

// ParseModules reads modules.dep and (if not nil) modules.builtin.
func ParseModules(dep, builtin io.Reader) (*Modules, error) {
	m := &Modules{path: map[string]string{}, deps: map[string][]string{}, builtin: map[string]bool{}}
	sc := bufio.NewScanner(dep)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: no ':' in %q", n, line)
		}
		name := ModuleName(mod)
		m.path[name] = mod
		var ds []string
		for _, d := range strings.Fields(rest) {
			ds = append(ds, ModuleName(d))
		}
		m.deps[name] = ds
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules.dep: %w", err)
	}
	if builtin != nil {
		sc := bufio.NewScanner(builtin)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" {
				m.builtin[ModuleName(line)] = true
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("reading modules.builtin: %w", err)
		}
	}
	return m, nil
}

// Order returns the relative paths of the named modules and of everything
// they depend on, each once, dependencies before the modules that need them:
// the order to load them in. A name may be a glob ("nft_*"), which stands
// for every matching module of modules.dep in name order. Built-in modules
// are left out; an unknown name, or a glob that matches nothing, is an error.
func (m *Modules) Order(names ...string) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var out []string
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("module dependency cycle through %s", name)
		}
		p, ok := m.path[name]
		if !ok {
			if m.builtin[name] {
				state[name] = done
				return nil
			}
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) is not in modules.dep", name, from)
			}
			return fmt.Errorf("module %s is neither in modules.dep nor built in", name)
		}
		state[name] = visiting
		for _, d := range m.deps[name] {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = done
		out = append(out, p)
		return nil
	}
	for _, n := range names {
		expanded, err := m.expand(n)
		if err != nil {
			return nil, err
		}
		for _, e := range expanded {
			if err := visit(e, ""); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// expand turns a glob into the sorted names of modules.dep it matches; a
// plain name stays itself.
func (m *Modules) expand(name string) ([]string, error) {
	name = ModuleName(name)
	if !strings.ContainsAny(name, "*?[") {
		return []string{name}, nil
	}
	var out []string
	for n := range m.path {
		ok, err := path.Match(name, n)
		if err != nil {
			return nil, fmt.Errorf("module pattern %q: %w", name, err)
		}
		if ok {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("module pattern %q matches no module", name)
	}
	slices.Sort(out)
	return out, nil
}
