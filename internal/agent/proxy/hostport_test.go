package proxy

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// A pod's hostPorts are served as the kubelet's portmap serves them: the
// same port on two host addresses and on two protocols goes to three pods,
// one set before Run; removing them closes the sockets.
func TestHostPorts(t *testing.T) {
	a, b := tcpBackend(t, "a"), tcpBackend(t, "b")
	u := udpBackend(t, "u")
	port := freePort(t, nodeIP, tcp)
	to := func(p int32) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p)) }
	lo, node := netip.MustParseAddr("127.0.0.70"), netip.MustParseAddr(nodeIP)
	h := startWith(t, nil, func(p *Proxy) {
		p.SetHostPorts("ns/pod1", []HostPort{{Protocol: tcp, HostIP: lo, Port: uint16(port), Target: to(a.port)}})
	})
	h.p.SetHostPorts("ns/pod2", []HostPort{{Protocol: tcp, HostIP: node, Port: uint16(port), Target: to(b.port)}})
	h.p.SetHostPorts("ns/pod3", []HostPort{{Protocol: udp, HostIP: node, Port: uint16(port), Target: to(u)}})
	if name, _ := waitServed(t, hostPort("127.0.0.70", port)); name != "a" {
		t.Errorf("127.0.0.70 answered by %q, want pod1's a", name)
	}
	if name, _ := waitServed(t, hostPort(nodeIP, port)); name != "b" {
		t.Errorf("the node address answered by %q, want pod2's b", name)
	}
	c, err := net.Dial("udp", hostPort(nodeIP, port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	poll.Until(t, 10*time.Second, "UDP hostPort", func() bool {
		if _, err := c.Write([]byte("hostname")); err != nil {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		return err == nil && string(buf[:n]) == "u:hostname"
	})
	// An unset hostIP is every node address.
	h.p.SetHostPorts("ns/pod1", []HostPort{{Protocol: tcp, Port: uint16(port), Target: to(a.port)}})
	h.p.SetHostPorts("ns/pod2", nil)
	poll.Until(t, 10*time.Second, "pod1 on the node address", func() bool { name, err := ask(hostPort(nodeIP, port)); return err == nil && name == "a" })
	if _, err := ask(hostPort("127.0.0.70", port)); !refused(err) {
		t.Errorf("127.0.0.70 after pod1 moved to every node address: %v", err)
	}
	h.p.SetHostPorts("ns/pod1", nil)
	waitRefused(t, hostPort(nodeIP, port))
}
