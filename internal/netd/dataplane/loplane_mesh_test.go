package dataplane

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// fakeWG is wireguard-go's device as loPlane sees it, recording its calls.
type fakeWG struct {
	log    *strings.Builder
	key    PrivateKey
	up     bool
	closed bool
	status string // what IpcGet writes
}

func (w *fakeWG) Name() string { return "utun7" }
func (w *fakeWG) SetKey(k PrivateKey) error {
	w.key = k
	fmt.Fprintln(w.log, "wg key")
	return nil
}
func (w *fakeWG) IpcSet(uapi string) error {
	fmt.Fprintf(w.log, "wg set %q\n", uapi)
	return nil
}
func (w *fakeWG) IpcGet(out io.Writer) error {
	_, err := io.WriteString(out, w.status)
	return err
}
func (w *fakeWG) Up() error {
	w.up = true
	return nil
}
func (w *fakeWG) Close() {
	w.closed = true
	fmt.Fprintln(w.log, "wg close")
}

// TestLoPlaneMesh: darwin's mesh device is made once, addressed and
// routed by the rendered commands, and changed only where the request
// differs; DelMesh closes it (the kernel removes its routes).
func TestLoPlaneMesh(t *testing.T) {
	f, d := newFakeMac(t)
	var made []*fakeWG
	d.newWG = func(mtu int) (wgDevice, error) {
		if mtu != 1380 {
			return nil, errors.New("bad MTU")
		}
		w := &fakeWG{log: &f.log}
		made = append(made, w)
		return w, nil
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	m := Mesh{PrivateKey: PrivateKey{1}, ListenPort: 51820, MTU: 1380}
	must(d.EnsureNode(macNode))
	f.log.Reset()
	name, err := d.EnsureMesh(macNode, m)
	must(err)
	_, err = d.EnsureMesh(macNode, m)
	must(err)
	p1, p2 := testMeshPeer(8), testMeshPeer(9)
	must(d.SetMeshPeers(macNode, m, []MeshPeer{p1, p2}))
	must(d.SetMeshPeers(macNode, m, []MeshPeer{p1, p2}))
	must(d.SetMeshPeers(macNode, m, []MeshPeer{p2}))
	if name != "utun7" || len(made) != 1 || !made[0].up || made[0].key != m.PrivateKey {
		t.Fatalf("EnsureMesh: %q, devices %d", name, len(made))
	}
	k8, k9 := strings.Repeat("08", 32), strings.Repeat("09", 32)
	want := `wg key
wg set "listen_port=51820\n"
run /sbin/ifconfig utun7 inet 100.64.7.1 100.64.7.1 mtu 1380 up
wg set "public_key=` + k8 + `\nendpoint=192.0.2.8:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=100.64.8.0/24\npublic_key=` + k9 + `\nendpoint=192.0.2.9:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=100.64.9.0/24\n"
run /sbin/route -q -n add -inet 100.64.8.0/24 -interface utun7
run /sbin/route -q -n add -inet 100.64.9.0/24 -interface utun7
wg set "public_key=` + k8 + `\nremove=true\n"
run /sbin/route -q -n delete -inet 100.64.8.0/24 -interface utun7
`
	if f.log.String() != want {
		t.Errorf("commands:\n%s\nwant:\n%s", f.log.String(), want)
	}

	made[0].status = "private_key=" + strings.Repeat("ab", 32) + "\npublic_key=" + k9 + "\nendpoint=192.0.2.9:51820\nlast_handshake_time_sec=1\nrx_bytes=3\n"
	st, err := d.MeshStatus()
	if err != nil || len(st) != 1 || st[0].PublicKey != p2.PublicKey || st[0].RxBytes != 3 {
		t.Fatalf("MeshStatus = %+v %v", st, err)
	}
	f.log.Reset()
	must(d.DelMesh(macNode))
	must(d.DelMesh(macNode))
	if !made[0].closed || f.log.String() != "wg close\n" {
		t.Errorf("DelMesh: closed %v, commands %q", made[0].closed, f.log.String())
	}
	if st, err := d.MeshStatus(); st != nil || err != nil {
		t.Errorf("MeshStatus without a device: %+v %v", st, err)
	}
	if err := d.SetMeshPeers(macNode, m, nil); err == nil {
		t.Error("SetMeshPeers without a device succeeded")
	}
	// Without a device maker (not darwin), EnsureMesh refuses.
	_, plain := newFakeMac(t)
	if _, err := plain.EnsureMesh(macNode, m); err == nil {
		t.Error("EnsureMesh without a device maker succeeded")
	}
}
