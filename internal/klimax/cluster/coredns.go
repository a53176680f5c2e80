package cluster

import (
	"fmt"
	"sort"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
)

const (
	blockBegin = "# klimax:begin "
	blockEnd   = "# klimax:end "
)

// ForwardBlock renders one CoreDNS server block forwarding domain to resolvers.
func ForwardBlock(r config.DNSResolver) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%s\n", blockBegin, r.Domain)
	fmt.Fprintf(&b, "%s:53 {\n", r.Domain)
	b.WriteString("    errors\n    cache 30\n")
	fmt.Fprintf(&b, "    forward . %s\n", strings.Join(r.Resolvers, " "))
	b.WriteString("}\n")
	fmt.Fprintf(&b, "%s%s\n", blockEnd, r.Domain)
	return b.String()
}

// EditCorefile returns corefile with klimax's forward blocks set to exactly
// resolvers: blocks klimax added before (between its marker comments) are
// removed, everything else is kept byte for byte, and the wanted blocks are
// appended. Running it twice with the same input is a no-op. It refuses when
// a domain already has a server block that klimax did not write, because
// CoreDNS would reject the duplicate zone.
func EditCorefile(corefile string, resolvers []config.DNSResolver) (string, error) {
	var kept []string
	lines := strings.SplitAfter(corefile, "\n")
	inOurs := ""
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case inOurs == "" && strings.HasPrefix(t, blockBegin):
			inOurs = strings.TrimPrefix(t, blockBegin)
		case inOurs != "" && t == blockEnd+inOurs:
			inOurs = ""
		case inOurs != "":
			// inside our block: dropped
		default:
			if l == "" && i == len(lines)-1 {
				continue
			}
			kept = append(kept, l)
		}
	}
	if inOurs != "" {
		return "", fmt.Errorf("Corefile has %q without its end marker; fix the coredns ConfigMap by hand", blockBegin+inOurs)
	}
	base := strings.Join(kept, "")
	zones := serverZones(base)
	rs := append([]config.DNSResolver(nil), resolvers...)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Domain < rs[j].Domain })
	var b strings.Builder
	b.WriteString(strings.TrimRight(base, "\n"))
	b.WriteString("\n")
	for _, r := range rs {
		d := strings.TrimSuffix(r.Domain, ".")
		if zones[d] {
			return "", fmt.Errorf("Corefile already has a server block for %s that klimax did not write; remove kind.customDnsResolvers entry %q or that block", d, r.Domain)
		}
		if len(r.Resolvers) == 0 {
			return "", fmt.Errorf("customDnsResolvers entry %q has no resolvers", r.Domain)
		}
		b.WriteString(ForwardBlock(r))
	}
	return b.String(), nil
}

// serverZones lists the zones of top-level server blocks ("a.dev:53 b.dev {").
func serverZones(corefile string) map[string]bool {
	zones := map[string]bool{}
	depth := 0
	for _, l := range strings.Split(corefile, "\n") {
		t := strings.TrimSpace(l)
		if i := strings.Index(t, "#"); i >= 0 {
			t = strings.TrimSpace(t[:i])
		}
		if depth == 0 && strings.HasSuffix(t, "{") {
			for _, z := range strings.Fields(strings.TrimSuffix(t, "{")) {
				z = strings.TrimPrefix(strings.TrimPrefix(z, "dns://"), ".:")
				if h, _, ok := strings.Cut(z, ":"); ok {
					z = h
				}
				zones[strings.TrimSuffix(z, ".")] = true
			}
		}
		depth += strings.Count(t, "{") - strings.Count(t, "}")
	}
	return zones
}
