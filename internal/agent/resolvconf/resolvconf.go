// Package resolvconf reads resolv.conf(5): the one parser of the node's
// resolver configuration, for the pods' resolv.conf (podspec) and the
// upstreams of the node's DNS server (dns).
//
// It is not miekg/dns's ClientConfigFromReader because that keeps only
// ndots, timeout and attempts of the options: a dnsPolicy Default pod gets
// the node's options as written (edns0, trust-ad, ...), as the kubelet
// gives them.
package resolvconf

import (
	"bufio"
	"io"
	"os"
	"strings"
)

// File is what a resolv.conf says, as written: callers decide which
// nameservers they can use.
type File struct {
	Nameservers []string // every nameserver line, in order
	Search      []string // the last search or domain line
	Options     []string // every options line's options, in order ("name" or "name:value")
}

// Parse reads a resolv.conf. Comments (# or ;) and lines without a value
// are skipped.
func Parse(r io.Reader) (File, error) {
	var f File
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		if len(w) < 2 || strings.HasPrefix(w[0], "#") || strings.HasPrefix(w[0], ";") {
			continue
		}
		switch w[0] {
		case "nameserver":
			f.Nameservers = append(f.Nameservers, w[1])
		case "search", "domain":
			f.Search = w[1:]
		case "options":
			f.Options = append(f.Options, w[1:]...)
		}
	}
	return f, sc.Err()
}

// Read parses the resolv.conf at path.
func Read(path string) (File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return File{}, err
	}
	defer fh.Close()
	return Parse(fh)
}
