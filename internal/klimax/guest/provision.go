// Package guest owns what klimax installs and runs inside the machine that
// hosts Docker: the idempotent, version-pinned provisioning script (sysctls,
// packages, Docker, kind, kubectl) rendered from templates with validated,
// typed inputs, and the validators for every value that reaches a root
// shell (CIDRs, paths, versions, digests).
package guest

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"sort"
	"text/template"
)

//go:embed templates/*.tmpl
var templates embed.FS

var tmpl = template.Must(template.ParseFS(templates, "templates/*.tmpl"))

// Tool is a binary installed from its publisher's release at a pinned
// version. SHA256 maps a Debian architecture (amd64, arm64) to the expected
// digest; for an architecture without one, the script verifies the download
// against the checksum file the publisher ships beside the same release.
type Tool struct {
	Version string
	SHA256  map[string]string
}

// Pinned defaults. kind v0.32.0 creates kindest/node v1.35.0 clusters (the
// default kind.nodeVersion) and the klimax/node v1.37.2 image `klimax
// node-image build` makes (v0.31.0 writes kubeadm v1beta3 configs, which
// kubeadm 1.36+ no longer reads); kubectl matches the default node version.
var (
	DefaultKind    = Tool{Version: "v0.32.0"}
	DefaultKubectl = Tool{Version: "v1.35.0"}
)

// DefaultDockerVersion is the docker-ce package version from Docker's apt
// repository for the Ubuntu 24.04 (noble) guest image.
const DefaultDockerVersion = "5:28.5.2-1~ubuntu.24.04~noble"

// DockerKeyFingerprint is the fingerprint of Docker's apt signing key; the
// script refuses a downloaded key with any other.
const DockerKeyFingerprint = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"

// Spec is the typed input of the provisioning script.
type Spec struct {
	Kind, Kubectl Tool
	// DockerVersion is the exact docker-ce / docker-ce-cli package version.
	DockerVersion string
	// InotifyMaxUserWatches / Instances: kind nodes run many inotify users.
	InotifyMaxUserWatches   int
	InotifyMaxUserInstances int
	// CacheDir is created for registry caches kept in the guest.
	CacheDir string
}

// DefaultSpec returns the pinned defaults.
func DefaultSpec() Spec {
	return Spec{
		Kind: DefaultKind, Kubectl: DefaultKubectl, DockerVersion: DefaultDockerVersion,
		InotifyMaxUserWatches: 1048576, InotifyMaxUserInstances: 8192,
		CacheDir: "/var/lib/klimax/registry-cache",
	}
}

// Validate checks every field before it can reach the root shell.
func (s Spec) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(ValidateVersion("kind version", s.Kind.Version))
	add(ValidateVersion("kubectl version", s.Kubectl.Version))
	for name, t := range map[string]Tool{"kind": s.Kind, "kubectl": s.Kubectl} {
		for arch, sum := range t.SHA256 {
			if arch != "amd64" && arch != "arm64" {
				add(&FieldError{name + " sha256 arch", arch, "is not a supported architecture", "use amd64 or arm64"})
			}
			if !sha256Re.MatchString(sum) {
				add(&FieldError{name + " sha256[" + arch + "]", sum, "is not a sha256 hex digest", "use 64 lower-case hex digits"})
			}
		}
	}
	if !debVersionRe.MatchString(s.DockerVersion) {
		add(&FieldError{"docker version", s.DockerVersion, "is not a Debian package version", "use e.g. " + DefaultDockerVersion})
	}
	if s.InotifyMaxUserWatches < 8192 || s.InotifyMaxUserWatches > 1<<24 {
		add(&FieldError{"inotify max_user_watches", fmt.Sprint(s.InotifyMaxUserWatches), "is out of range", "use 8192..16777216"})
	}
	if s.InotifyMaxUserInstances < 128 || s.InotifyMaxUserInstances > 1<<20 {
		add(&FieldError{"inotify max_user_instances", fmt.Sprint(s.InotifyMaxUserInstances), "is out of range", "use 128..1048576"})
	}
	add(ValidatePath("registry cache dir", s.CacheDir))
	if !fingerprintRe.MatchString(DockerKeyFingerprint) {
		add(errors.New("internal: bad Docker key fingerprint"))
	}
	return errors.Join(errs...)
}

type toolData struct {
	Name, Version, URL, SumURL string
	Sums                       []archSum
	SumField                   int // field of the publisher's checksum file holding the digest
}

type archSum struct{ Arch, Sum string }

type scriptData struct {
	Spec
	Fingerprint string
	Tools       []toolData
}

func sums(t Tool) []archSum {
	var out []archSum
	for a, s := range t.SHA256 {
		out = append(out, archSum{a, s})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Arch < out[j].Arch })
	return out
}

// Render renders the provisioning script (bash, run as root at every boot:
// each step checks before it changes anything).
func Render(s Spec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("guest provisioning: %w", err)
	}
	d := scriptData{Spec: s, Fingerprint: DockerKeyFingerprint, Tools: []toolData{
		{
			Name: "kind", Version: s.Kind.Version, Sums: sums(s.Kind), SumField: 1,
			URL:    "https://github.com/kubernetes-sigs/kind/releases/download/" + s.Kind.Version + "/kind-linux-${arch}",
			SumURL: "https://github.com/kubernetes-sigs/kind/releases/download/" + s.Kind.Version + "/kind-linux-${arch}.sha256sum",
		},
		{
			Name: "kubectl", Version: s.Kubectl.Version, Sums: sums(s.Kubectl), SumField: 1,
			URL:    "https://dl.k8s.io/release/" + s.Kubectl.Version + "/bin/linux/${arch}/kubectl",
			SumURL: "https://dl.k8s.io/release/" + s.Kubectl.Version + "/bin/linux/${arch}/kubectl.sha256",
		},
	}}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, "provision.sh.tmpl", d); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
