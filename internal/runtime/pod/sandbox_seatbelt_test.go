package pod

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox/seatbelt"
)

// seatbeltInput lays out a pod as the runtime does, reached through a
// symlinked data dir (as /var is /private/var on macOS).
func seatbeltInput(t *testing.T) (sandboxInput, string) {
	t.Helper()
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(tmp, "real")
	pod := filepath.Join(real, "pods", "uid-1")
	for _, d := range []string{filepath.Join(pod, "roots", "web"), filepath.Join(pod, "volumes", "data"), filepath.Join(pod, "volumes", "cfg")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(tmp, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	lpod := filepath.Join(link, "pods", "uid-1")
	return sandboxInput{
		Pod:       &runtimev1.PodSpec{Uid: "uid-1", ResolvConf: "nameserver 10.43.0.10\n"},
		Container: &runtimev1.ContainerSpec{Name: "web"},
		PodDir:    lpod,
		Root:      filepath.Join(lpod, "roots", "web"),
		Writable:  []string{filepath.Join(lpod, "volumes", "data")},
		ReadOnly:  []string{filepath.Join(lpod, "volumes", "cfg")},
	}, real
}

var me = daemonIdentity{UID: 501, GID: 20, Groups: []int{20, 12, 61}}

func TestSeatbeltPod(t *testing.T) {
	in, real := seatbeltInput(t)
	f := false
	in.Container.SecurityContext = &runtimev1.SecurityContext{ReadOnlyRootFilesystem: true, AllowPrivilegeEscalation: &f, RunAsNonRoot: true}
	p, err := seatbeltPod(in, me)
	if err != nil {
		t.Fatal(err)
	}
	pod := filepath.Join(real, "pods", "uid-1")
	want := seatbelt.Pod{
		DataDir: real, PodDir: pod, Root: filepath.Join(pod, "roots", "web"),
		ReadOnlyRoot: true, NoPrivilegeEscalation: true,
		Writable:  []string{filepath.Join(pod, "volumes", "data")},
		ReadOnly:  []string{filepath.Join(pod, "volumes", "cfg")},
		ReadFiles: []string{filepath.Join(pod, "resolv.conf")}, // not written yet: still named
	}
	if p.DataDir != want.DataDir || p.PodDir != want.PodDir || p.Root != want.Root || p.ReadOnlyRoot != want.ReadOnlyRoot ||
		p.NoPrivilegeEscalation != want.NoPrivilegeEscalation || p.Network || !slices.Equal(p.Writable, want.Writable) ||
		!slices.Equal(p.ReadOnly, want.ReadOnly) || !slices.Equal(p.ReadFiles, want.ReadFiles) {
		t.Fatalf("got  %+v\nwant %+v", p, want)
	}
	// And it renders: the paths the profile names are the resolved ones.
	prof, err := seatbelt.Profile(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(prof, "/link/") || !strings.Contains(prof, `(subpath "`+want.Root+`")`) {
		t.Errorf("profile does not name the resolved root %s", want.Root)
	}

	// Unset allowPrivilegeEscalation is allowed, as upstream.
	in.Container.SecurityContext = &runtimev1.SecurityContext{}
	if p, err := seatbeltPod(in, me); err != nil || p.NoPrivilegeEscalation || p.ReadOnlyRoot {
		t.Errorf("empty securityContext: %+v, %v", p, err)
	}
	in.Container.SecurityContext = nil
	if _, err := seatbeltPod(in, me); err != nil {
		t.Errorf("no securityContext: %v", err)
	}
}

func TestSeatbeltPodNetwork(t *testing.T) {
	in, _ := seatbeltInput(t)
	for _, c := range []struct {
		ann     map[string]string
		hostNet bool
		want    bool
		err     string
	}{
		{nil, false, false, ""},
		{map[string]string{seatbelt.NetworkAnnotation: "allow"}, false, true, ""},
		{map[string]string{seatbelt.NetworkAnnotation: "deny"}, false, false, ""},
		{nil, true, true, ""},
		{map[string]string{seatbelt.NetworkAnnotation: "deny"}, true, false, "spec.hostNetwork"},
		{map[string]string{seatbelt.NetworkAnnotation: "on"}, false, false, `annotation k3sm.dev/network: "on"`},
	} {
		in.Pod.Annotations, in.Pod.HostNetwork = c.ann, c.hostNet
		p, err := seatbeltPod(in, me)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v hostNetwork=%v: error %v, want %q", c.ann, c.hostNet, err, c.err)
			}
			continue
		}
		if err != nil || p.Network != c.want {
			t.Errorf("%v hostNetwork=%v: network %v, %v; want %v", c.ann, c.hostNet, p.Network, err, c.want)
		}
	}
}

func TestSeatbeltPodRefusals(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		sc   *runtimev1.SecurityContext
		pod  func(*runtimev1.PodSpec)
		id   *daemonIdentity
		want string
	}{
		{sc: &runtimev1.SecurityContext{Privileged: true}, want: "securityContext.privileged"},
		{sc: &runtimev1.SecurityContext{CapabilitiesAdd: []string{"NET_ADMIN"}}, want: "securityContext.capabilities.add"},
		{sc: &runtimev1.SecurityContext{RunAsUser: i(1000)}, want: "securityContext.runAsUser 1000"},
		{sc: &runtimev1.SecurityContext{RunAsGroup: i(3000)}, want: "securityContext.runAsGroup 3000"},
		{sc: &runtimev1.SecurityContext{FsGroup: i(2000)}, want: "securityContext.fsGroup 2000"},
		{sc: &runtimev1.SecurityContext{SupplementalGroups: []int64{20, 4000}}, want: "securityContext.supplementalGroups 4000"},
		{sc: &runtimev1.SecurityContext{RunAsNonRoot: true}, id: &daemonIdentity{UID: 0, GID: 0}, want: "securityContext.runAsNonRoot"},
		{sc: &runtimev1.SecurityContext{SeccompProfile: "Unconfined"}, want: "seccompProfile Unconfined"},
		{sc: &runtimev1.SecurityContext{SeccompProfile: "Localhost/x.json"}, want: "seccompProfile Localhost/x.json"},
		{sc: &runtimev1.SecurityContext{ProcMount: "Unmasked"}, want: "procMount Unmasked"},
		{pod: func(p *runtimev1.PodSpec) { p.HostPid = true }, want: "spec.hostPID"},
		{pod: func(p *runtimev1.PodSpec) { p.HostIpc = true }, want: "spec.hostIPC"},
	} {
		in, _ := seatbeltInput(t)
		in.Container.SecurityContext = c.sc
		if c.pod != nil {
			c.pod(in.Pod)
		}
		id := me
		if c.id != nil {
			id = *c.id
		}
		if _, err := seatbeltPod(in, id); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %q", c.sc, err, c.want)
		}
	}
	// What darwin honours as it is: k3sm's own uid, gid and groups, the
	// runtime default, dropped capabilities.
	in, _ := seatbeltInput(t)
	in.Container.SecurityContext = &runtimev1.SecurityContext{RunAsUser: i(501), RunAsGroup: i(20), FsGroup: i(20),
		SupplementalGroups: []int64{12}, RunAsNonRoot: true, SeccompProfile: "RuntimeDefault", CapabilitiesDrop: []string{"ALL"}}
	if _, err := seatbeltPod(in, me); err != nil {
		t.Errorf("a restricted pod as k3sm's user: %v", err)
	}
}

func TestSeatbeltPodRefusesOtherPodsVolume(t *testing.T) {
	in, real := seatbeltInput(t)
	other := filepath.Join(real, "pods", "uid-2", "volumes", "secret")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	in.ReadOnly = append(in.ReadOnly, other)
	p, err := seatbeltPod(in, me)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seatbelt.Profile(p); err == nil || !strings.Contains(err.Error(), "inside k3sm's data dir") {
		t.Errorf("another pod's volume: %v", err)
	}
}
