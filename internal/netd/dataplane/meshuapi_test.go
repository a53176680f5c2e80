package dataplane

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func testMeshPeer(b byte) MeshPeer {
	return MeshPeer{PublicKey: [32]byte(bytes.Repeat([]byte{b}, 32)), Endpoint: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, b}), 51820),
		CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, b, 0}), 24), Keepalive: 25 * time.Second}
}

// The peers' "set" text says only what changed.
func TestMeshPeersUAPI(t *testing.T) {
	p1, p2 := testMeshPeer(1), testMeshPeer(2)
	k1, k2 := strings.Repeat("01", 32), strings.Repeat("02", 32)
	text, have := meshPeersUAPI(map[[32]byte]MeshPeer{}, []MeshPeer{p1, p2})
	want := "public_key=" + k1 + "\nendpoint=192.0.2.1:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=100.64.1.0/24\n" +
		"public_key=" + k2 + "\nendpoint=192.0.2.2:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=100.64.2.0/24\n"
	if text != want || len(have) != 2 {
		t.Fatalf("from none:\n%s", text)
	}
	if text, _ := meshPeersUAPI(have, []MeshPeer{p1, p2}); text != "" {
		t.Fatalf("unchanged:\n%s", text)
	}
	moved := p2
	moved.Endpoint = netip.MustParseAddrPort("192.0.2.9:1")
	text, have = meshPeersUAPI(have, []MeshPeer{moved})
	if want := "public_key=" + k1 + "\nremove=true\npublic_key=" + k2 + "\nendpoint=192.0.2.9:1\n"; text != want {
		t.Fatalf("p1 gone, p2 moved:\n%s", text)
	}
	if text, _ := meshPeersUAPI(nil, []MeshPeer{moved}); !strings.HasPrefix(text, "replace_peers=true\npublic_key="+k2+"\nendpoint=") {
		t.Fatalf("after a failed set:\n%s", text)
	}
	if text, _ := meshPeersUAPI(have, nil); text != "public_key="+k2+"\nremove=true\n" {
		t.Fatalf("none:\n%s", text)
	}
}

// The "get" text: peers from their public_key lines; the device's own
// lines before them (the private key among them) are skipped.
func TestParseMeshStatus(t *testing.T) {
	text := "private_key=" + strings.Repeat("ab", 32) + "\nlisten_port=51820\n" +
		"public_key=" + strings.Repeat("02", 32) + "\npreshared_key=" + strings.Repeat("00", 32) + "\nprotocol_version=1\nendpoint=192.0.2.2:51820\n" +
		"last_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\ntx_bytes=10\nrx_bytes=20\npersistent_keepalive_interval=25\nallowed_ip=100.64.2.0/24\n" +
		"public_key=" + strings.Repeat("01", 32) + "\nprotocol_version=1\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\n"
	st, err := parseMeshStatus([]byte(text))
	if err != nil || len(st) != 2 {
		t.Fatalf("%+v %v", st, err)
	}
	if st[0].PublicKey != testMeshPeer(1).PublicKey || !st[0].LastHandshake.IsZero() || st[0].Endpoint.IsValid() {
		t.Errorf("peer 1 (no handshake, no endpoint) = %+v", st[0])
	}
	if st[1].PublicKey != testMeshPeer(2).PublicKey || st[1].Endpoint != netip.MustParseAddrPort("192.0.2.2:51820") ||
		!st[1].LastHandshake.Equal(time.Unix(1700000000, 5)) || st[1].TxBytes != 10 || st[1].RxBytes != 20 {
		t.Errorf("peer 2 = %+v", st[1])
	}
	for _, bad := range []string{"public_key=zz\n", "public_key=" + strings.Repeat("01", 32) + "\nrx_bytes=-1\n"} {
		if _, err := parseMeshStatus([]byte(bad)); err == nil || strings.Contains(err.Error(), "zz") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
