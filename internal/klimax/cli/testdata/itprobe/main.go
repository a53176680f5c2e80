// Command itprobe is the one program of the klimax node-image integration
// test's own images (nothing is pulled from a public registry):
//
//	itprobe serve ADDR TEXT       HTTP server answering TEXT
//	itprobe dns ADDR ZONE IP      DNS server answering A IP for names in ZONE
//	itprobe get URL               prints the body of GET URL (retries 60 s)
//	itprobe lookup NAME           resolves NAME with the system resolver (retries 60 s)
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: itprobe serve|dns|get|lookup ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		text := os.Args[3]
		err := http.ListenAndServe(os.Args[2], http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, text) }))
		fail(err)
	case "dns":
		fail(serveDNS(os.Args[2], os.Args[3], os.Args[4]))
	case "get":
		retry(func() error {
			c := http.Client{Timeout: 3 * time.Second}
			resp, err := c.Get(os.Args[2])
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil {
				fmt.Println(string(b))
			}
			return err
		})
	case "lookup":
		retry(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			addrs, err := net.DefaultResolver.LookupHost(ctx, os.Args[2])
			if err == nil {
				fmt.Println(strings.Join(addrs, " "))
			}
			return err
		})
	default:
		fail(fmt.Errorf("unknown mode %q", os.Args[1]))
	}
}

func retry(fn func() error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			fail(err)
		}
		fmt.Fprintln(os.Stderr, "retry:", err)
		time.Sleep(time.Second)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "itprobe:", err)
	os.Exit(1)
}

func serveDNS(addr, zone, ip string) error {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return fmt.Errorf("IP %q: want an IPv4 address", ip)
	}
	zone = strings.TrimSuffix(zone, ".") + "."
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}
		b := dnsmessage.NewBuilder(nil, rh)
		b.EnableCompression()
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		name := strings.ToLower(q.Name.String())
		if q.Type == dnsmessage.TypeA && (name == zone || strings.HasSuffix(name, "."+zone)) {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a.As4()})
		}
		out, err := b.Finish()
		if err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}
