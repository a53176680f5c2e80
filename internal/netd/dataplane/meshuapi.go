package dataplane

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The text of wireguard-go's configuration protocol ("UAPI"), written
// and read here for every OS's mesh device.

// meshPeersUAPI is the "set" text that turns the peers last applied
// (have; nil: unknown, after a failed set) into peers, and the new
// applied set. Only what differs is sent: an endpoint set again would
// undo the peer's roaming, a keepalive set again sends one at once. It
// holds public data only: keys in hex, endpoints, ranges, keepalives.
func meshPeersUAPI(have map[[32]byte]MeshPeer, peers []MeshPeer) (string, map[[32]byte]MeshPeer) {
	want := make(map[[32]byte]MeshPeer, len(peers))
	for _, p := range peers {
		want[p.PublicKey] = p
	}
	var b strings.Builder
	if have == nil {
		b.WriteString("replace_peers=true\n")
	}
	var gone [][32]byte
	for k := range have {
		if _, ok := want[k]; !ok {
			gone = append(gone, k)
		}
	}
	slices.SortFunc(gone, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	for _, k := range gone {
		fmt.Fprintf(&b, "public_key=%s\nremove=true\n", hex.EncodeToString(k[:]))
	}
	for _, p := range peers {
		old, had := have[p.PublicKey]
		if had && old == p {
			continue
		}
		fmt.Fprintf(&b, "public_key=%s\n", hex.EncodeToString(p.PublicKey[:]))
		if !had || old.Endpoint != p.Endpoint {
			fmt.Fprintf(&b, "endpoint=%s\n", p.Endpoint)
		}
		if !had || old.Keepalive != p.Keepalive {
			fmt.Fprintf(&b, "persistent_keepalive_interval=%d\n", int(p.Keepalive/time.Second))
		}
		if !had || old.CIDR != p.CIDR {
			fmt.Fprintf(&b, "replace_allowed_ips=true\nallowed_ip=%s\n", p.CIDR)
		}
	}
	return b.String(), want
}

// parseMeshStatus reads wireguard-go's UAPI "get" text: a peer begins at
// its public_key line; the device's lines before the first peer are
// skipped unread (the private key among them).
func parseMeshStatus(text []byte) ([]MeshPeerStatus, error) {
	var out []MeshPeerStatus
	var cur *MeshPeerStatus
	var sec, nsec int64
	flush := func() {
		if cur != nil {
			if sec != 0 || nsec != 0 {
				cur.LastHandshake = time.Unix(sec, nsec)
			}
			out = append(out, *cur)
		}
		sec, nsec = 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		key, value, ok := bytes.Cut(sc.Bytes(), []byte("="))
		if !ok {
			continue
		}
		if string(key) == "public_key" {
			flush()
			cur = &MeshPeerStatus{}
			if n, err := hex.Decode(cur.PublicKey[:], value); err != nil || n != 32 {
				return nil, fmt.Errorf("dataplane: mesh status: a peer's public key is not 32 bytes of hex")
			}
			continue
		}
		if cur == nil {
			continue
		}
		var err error
		v := string(value)
		switch string(key) {
		case "endpoint":
			cur.Endpoint, err = netip.ParseAddrPort(v)
		case "last_handshake_time_sec":
			sec, err = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, err = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			cur.RxBytes, err = strconv.ParseUint(v, 10, 64)
		case "tx_bytes":
			cur.TxBytes, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return nil, fmt.Errorf("dataplane: mesh status: %s: %w", key, err)
		}
	}
	flush()
	slices.SortFunc(out, func(a, b MeshPeerStatus) int { return bytes.Compare(a.PublicKey[:], b.PublicKey[:]) })
	return out, sc.Err()
}
