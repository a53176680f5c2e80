//go:build linux

package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// defaultPath is the PATH of upstream's Alpine, Debian and busybox bases.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Labels every image carries: which upstream image it stands in for and
// which recipe made it (this also gives images that share every layer,
// such as the two agnhost or busybox tags, different digests).
const (
	labelUpstream = "dev.k3sm.conformance.upstream"
	labelBuilder  = "dev.k3sm.conformance.builder"
)

// recipe builds one image of the manifest.
type recipe struct {
	id string // manifest.go ImageID
	// extra is an image the manifest does not list (ref given in full,
	// the registry as a RegistryList field).
	extra *imageConfig
	build func(b *builder, c imageConfig) (v1.Image, error)
}

// recipes are the images built, by manifest.go ImageID.
var recipes = []recipe{
	{id: "Agnhost", build: (*builder).agnhost},
	{id: "AgnhostPrev", build: (*builder).agnhost},
	{id: "BusyBox", build: (*builder).busybox},
	// Not in manifest.go: DRA and CSI-mock manifests and node e2e name it.
	{id: "BusyBoxPrev", extra: &imageConfig{field: "PromoterE2eRegistry", name: "busybox", version: "1.36.1-1"}, build: (*builder).busybox},
	{id: "Nginx", build: (*builder).nginx},
	{id: "NginxNew", build: (*builder).nginx},
	{id: "Kitten", build: webserverImage("kitten")},
	{id: "Nautilus", build: webserverImage("nautilus")},
	{id: "Nonewprivs", build: (*builder).nonewprivs},
	{id: "NonRoot", build: (*builder).nonroot},
	{id: "APIServer", build: (*builder).sampleAPIServer},
	{id: "Pause", build: (*builder).pause},
	{id: "Etcd", build: (*builder).etcd},
	{id: "GlibcDnsTesting", build: debianOnly([]string{"bash"})},
	{id: "IpcUtils", build: debianOnly([]string{"/bin/sh"})},
}

// agnhostVersions are the tags of the manifest's agnhost images.
func (b *builder) agnhostVersions() []string {
	var vs []string
	for _, id := range []string{"Agnhost", "AgnhostPrev"} {
		if c, ok := b.man.images[id]; ok {
			vs = append(vs, c.version)
		}
	}
	return vs
}

// layer returns the layer file name in the layer cache, writing it with
// fill when missing; the same v1.Layer is returned to every image.
func (b *builder) layer(name string, fill func(tw *tar.Writer) error) (v1.Layer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l, ok := b.layers[name]; ok {
		return l, nil
	}
	p := filepath.Join(b.layerDir(), name+".tar.gz")
	if _, err := os.Stat(p); err != nil {
		if err := os.MkdirAll(b.layerDir(), 0o755); err != nil {
			return nil, err
		}
		if err := createLayer(p, fill); err != nil {
			return nil, fmt.Errorf("layer %s: %w", name, err)
		}
	}
	l, err := openLayer(p)
	if err != nil {
		return nil, err
	}
	b.layers[name] = l
	return l, nil
}

func (b *builder) layerDir() string {
	return filepath.Join(b.cache, "layers", fmt.Sprintf("%s-etcd%s-b%s-%s-%s", b.k8sVersion, b.etcdVersion, builderVersion, runtime.GOARCH, rootfsKey(b.suite)))
}

// debianLayer is the shared base: the whole Debian rootfs.
func (b *builder) debianLayer() (v1.Layer, error) {
	return b.layer("debian-rootfs", func(tw *tar.Writer) error {
		return writeTree(tw, b.rootfs, map[string]bool{"dev": true, "proc": true, "sys": true})
	})
}

// image assembles layers with upstream's config basics.
func (b *builder) image(c imageConfig, layers []v1.Layer, set func(*v1.Config)) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{defaultPath}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{labelUpstream: b.man.upstreamRef(c), labelBuilder: builderVersion}
	if set != nil {
		set(&cf.Config)
	}
	return mutate.ConfigFile(img, cf)
}

func ports(ps ...string) map[string]struct{} {
	m := map[string]struct{}{}
	for _, p := range ps {
		m[p+"/tcp"] = struct{}{}
	}
	return m
}

// agnhostLayers are the Debian rootfs plus upstream agnhost's own files
// (test/images/agnhost/Dockerfile). Left out: the coredns binary
// (/coredns, from a GitHub release) and the fake registry's /var/registry
// (images pulled from registry.k8s.io): no conformance spec uses them.
func (b *builder) agnhostLayers(version string) ([]v1.Layer, error) {
	base, err := b.debianLayer()
	if err != nil {
		return nil, err
	}
	users, err := b.userEntries()
	if err != nil {
		return nil, err
	}
	porter := filepath.Join(b.k8sSrc, "test", "images", "agnhost", "porter")
	top, err := b.layer("agnhost-"+version, func(tw *tar.Writer) error {
		return writeEntries(tw, append(users,
			entry{name: "agnhost", mode: 0o755, src: b.binary("agnhost-" + version)},
			entry{name: "agnhost-2", link: "agnhost"},
			entry{name: "uploads", dir: true, mode: 0o755},
			entry{name: "localhost.crt", mode: 0o644, src: filepath.Join(porter, "localhost.crt")},
			entry{name: "localhost.key", mode: 0o644, src: filepath.Join(porter, "localhost.key")},
			entry{name: "usr/local/bin/iperf", link: "../../bin/iperf"},
		))
	})
	if err != nil {
		return nil, err
	}
	return []v1.Layer{base, top}, nil
}

func (b *builder) agnhost(c imageConfig) (v1.Image, error) {
	layers, err := b.agnhostLayers(c.version)
	if err != nil {
		return nil, err
	}
	return b.image(c, layers, func(cfg *v1.Config) {
		cfg.Entrypoint = []string{"/agnhost"}
		cfg.Cmd = []string{"pause"}
		cfg.ExposedPorts = ports("80", "8080", "8081", "9376", "5000")
	})
}

// webserverImage is kitten or nautilus: agnhost (the manifest's current
// tag, upstream's BASEIMAGE) plus the picture and data.json at /, running
// agnhost test-webserver.
func webserverImage(name string) func(b *builder, c imageConfig) (v1.Image, error) {
	return func(b *builder, c imageConfig) (v1.Image, error) {
		layers, err := b.agnhostLayers(b.man.images["Agnhost"].version)
		if err != nil {
			return nil, err
		}
		html := filepath.Join(b.k8sSrc, "test", "images", name, "html")
		top, err := b.layer(name, func(tw *tar.Writer) error {
			return writeEntries(tw, []entry{
				{name: name + ".jpg", mode: 0o644, src: filepath.Join(html, name+".jpg")},
				{name: "data.json", mode: 0o644, src: filepath.Join(html, "data.json")},
			})
		})
		if err != nil {
			return nil, err
		}
		return b.image(c, append(layers, top), func(cfg *v1.Config) {
			cfg.Entrypoint = []string{"/agnhost"}
			cfg.Cmd = []string{"test-webserver"}
			cfg.ExposedPorts = ports("80", "8080", "8081", "9376", "5000")
		})
	}
}

// userEntries are the rootfs's /etc/passwd, group, shadow and gshadow with
// agnhost's user-defined-in-image (uid 1000, its own group 1000, as
// Alpine's adduser -D makes it) in group-defined-in-image (gid 50000), and
// its home.
func (b *builder) userEntries() ([]entry, error) {
	add := map[string][]string{
		"etc/passwd":  {"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh"},
		"etc/group":   {"user-defined-in-image:x:1000:", "group-defined-in-image:x:50000:user-defined-in-image"},
		"etc/shadow":  {"user-defined-in-image:!:19000:0:99999:7:::"},
		"etc/gshadow": {"user-defined-in-image:!::", "group-defined-in-image:!::user-defined-in-image"},
	}
	var out []entry
	for _, name := range []string{"etc/passwd", "etc/group", "etc/shadow", "etc/gshadow"} {
		e, err := b.appendLines(name, add[name])
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return append(out, entry{name: "home/user-defined-in-image", dir: true, mode: 0o755, uid: 1000, gid: 1000}), nil
}

// appendLines is the rootfs file name with lines added (those whose first
// field is already there are not), keeping its mode and owner.
func (b *builder) appendLines(name string, lines []string) (entry, error) {
	p, err := rootfsFile(b.rootfs, name)
	if err != nil {
		return entry{}, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return entry{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return entry{}, err
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		have[strings.SplitN(l, ":", 2)[0]] = true
	}
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		data = append(data, '\n')
	}
	for _, l := range lines {
		if !have[strings.SplitN(l, ":", 2)[0]] {
			data = append(data, l+"\n"...)
		}
	}
	e := entry{name: name, mode: int64(fi.Mode().Perm()), data: data}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.uid, e.gid = int(st.Uid), int(st.Gid)
	}
	return e, nil
}

// Files of the standalone (non-Debian) images.
var (
	busyboxPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`
	busyboxGroup = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:12:
www-data:x:33:
operator:x:37:
staff:x:50:
audio:x:29:
users:x:100:
nogroup:x:65534:
`
	busyboxShadow = `root:*::0:::::
daemon:*::0:::::
bin:*::0:::::
sys:*::0:::::
sync:*::0:::::
mail:*::0:::::
www-data:*::0:::::
operator:*::0:::::
nobody:*::0:::::
`
	nsswitch = "hosts: files dns\n"
)

// busyboxApplets asks busybox which applets it has, with their usual
// directories (bin/sh, usr/bin/env, sbin/ifconfig, ...).
func busyboxApplets(bin string) ([]string, error) {
	out, err := exec.Command(bin, "--list-full").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		if out, err = exec.Command(bin, "--list").Output(); err != nil {
			return nil, fmt.Errorf("%s --list: %v", bin, err)
		}
	}
	var applets []string
	for _, f := range strings.Fields(string(out)) {
		f = strings.TrimPrefix(f, "/")
		if f != "" && filepath.Base(f) != "busybox" {
			applets = append(applets, f)
		}
	}
	sort.Strings(applets)
	return applets, nil
}

// busyboxLayer is a root of its own: our static busybox at
// /bin/busybox with every applet in /bin (as upstream's busybox image has
// them) and also at its --list-full place (usr/bin/env, sbin/ifconfig),
// all relative symlinks; /etc/passwd, group, shadow as upstream's;
// /tmp 1777.
func (b *builder) busyboxLayer() (v1.Layer, error) {
	return b.layer("busybox-"+busyboxVersion+"-b"+busyboxBuild, func(tw *tar.Writer) error {
		applets, err := busyboxApplets(b.bbBin)
		if err != nil {
			return err
		}
		es := []entry{
			{name: "bin", dir: true}, {name: "dev", dir: true}, {name: "etc", dir: true},
			{name: "home", dir: true}, {name: "proc", dir: true}, {name: "root", dir: true, mode: 0o700},
			{name: "sys", dir: true}, {name: "tmp", dir: true, mode: 0o1777}, {name: "usr", dir: true},
			{name: "usr/bin", dir: true}, {name: "usr/sbin", dir: true}, {name: "sbin", dir: true},
			{name: "var", dir: true}, {name: "var/spool", dir: true}, {name: "var/spool/mail", dir: true},
			{name: "var/www", dir: true},
			{name: "bin/busybox", mode: 0o755, src: b.bbBin},
			{name: "etc/passwd", mode: 0o644, data: []byte(busyboxPasswd)},
			{name: "etc/group", mode: 0o644, data: []byte(busyboxGroup)},
			{name: "etc/shadow", mode: 0o600, data: []byte(busyboxShadow)},
			{name: "etc/nsswitch.conf", mode: 0o644, data: []byte(nsswitch)},
		}
		seen := map[string]bool{"bin/busybox": true}
		link := func(p string) {
			if seen[p] {
				return
			}
			seen[p] = true
			rel, _ := filepath.Rel(filepath.Dir("/"+p), "/bin/busybox")
			es = append(es, entry{name: p, link: rel})
		}
		for _, a := range applets {
			link("bin/" + filepath.Base(a))
		}
		for _, a := range applets {
			if strings.Contains(a, "/") {
				link(a)
			}
		}
		return writeEntries(tw, es)
	})
}

// busybox is upstream's busybox (the e2e-test-images promotion of
// docker.io/library/busybox): CMD ["sh"].
func (b *builder) busybox(c imageConfig) (v1.Image, error) {
	l, err := b.busyboxLayer()
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{l}, func(cfg *v1.Config) {
		cfg.Cmd = []string{"sh"}
	})
}

// nginxDefaultSite replaces Debian's default site: the same welcome page
// on port 80, with the IPv6 listener only where the pod has IPv6 (as
// upstream's 10-listen-on-ipv6-by-default.sh does), since nginx will not
// start when [::]:80 cannot be bound.
const nginxDefaultSite = `server {
	listen 80 default_server;
	include /etc/nginx/listen-ipv6.con[f];
	root /var/www/html;
	index index.html index.htm index.nginx-debian.html;
	server_name _;
	location / {
		try_files $uri $uri/ =404;
	}
}
`

const nginxEntrypoint = `#!/bin/sh
# As upstream nginx's docker-entrypoint.sh: listen on IPv6 too when the
# pod has it, then run the command.
if [ "$1" = nginx ] && [ -e /proc/net/if_inet6 ] && [ ! -e /etc/nginx/listen-ipv6.conf ]; then
	{ echo 'listen [::]:80 default_server;' > /etc/nginx/listen-ipv6.conf; } 2>/dev/null || true
fi
exec "$@"
`

// nginx is Debian's nginx (not upstream's 1.27/1.28: the tags only
// differ by label) serving its welcome page on port 80 in the foreground;
// the master runs as root, workers as www-data (Debian's nginx.conf).
// Logs go to /var/log/nginx as Debian has them.
func (b *builder) nginx(c imageConfig) (v1.Image, error) {
	base, err := b.debianLayer()
	if err != nil {
		return nil, err
	}
	top, err := b.layer("nginx", func(tw *tar.Writer) error {
		return writeEntries(tw, []entry{
			{name: "etc/nginx/sites-available/default", mode: 0o644, data: []byte(nginxDefaultSite)},
			{name: "docker-entrypoint.sh", mode: 0o755, data: []byte(nginxEntrypoint)},
		})
	})
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{base, top}, func(cfg *v1.Config) {
		cfg.Entrypoint = []string{"/docker-entrypoint.sh"}
		cfg.Cmd = []string{"nginx", "-g", "daemon off;"}
		cfg.ExposedPorts = ports("80")
		cfg.StopSignal = "SIGQUIT"
	})
}

// nonewprivs: nnp (prints its effective uid) setuid and setgid root in
// /usr/local/bin (chmod +s), CMD ["nnp"].
func (b *builder) nonewprivs(c imageConfig) (v1.Image, error) {
	base, err := b.debianLayer()
	if err != nil {
		return nil, err
	}
	top, err := b.layer("nonewprivs", func(tw *tar.Writer) error {
		return writeEntries(tw, []entry{{name: "usr/local/bin/nnp", mode: 0o6755, src: b.binary("nnp")}})
	})
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{base, top}, func(cfg *v1.Config) {
		cfg.Cmd = []string{"nnp"}
	})
}

// nonroot: the Debian base with USER 1234 (upstream: debian-base, whose
// CMD is /bin/sh).
func (b *builder) nonroot(c imageConfig) (v1.Image, error) {
	base, err := b.debianLayer()
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{base}, func(cfg *v1.Config) {
		cfg.User = "1234"
		cfg.Cmd = []string{"/bin/sh"}
	})
}

// debianOnly is an image that is the Debian base with cmd: glibc-dns-testing
// (upstream: debian bookworm-slim with dnsutils, CMD bash; its coredns is
// left out) and ipc-utils (upstream: Alpine with util-linux).
func debianOnly(cmd []string) func(b *builder, c imageConfig) (v1.Image, error) {
	return func(b *builder, c imageConfig) (v1.Image, error) {
		base, err := b.debianLayer()
		if err != nil {
			return nil, err
		}
		return b.image(c, []v1.Layer{base}, func(cfg *v1.Config) {
			cfg.Cmd = cmd
		})
	}
}

// sampleAPIServer: k8s.io/sample-apiserver at the pinned Kubernetes
// version (upstream's tag is an older build) at /sample-apiserver.
func (b *builder) sampleAPIServer(c imageConfig) (v1.Image, error) {
	base, err := b.debianLayer()
	if err != nil {
		return nil, err
	}
	top, err := b.layer("sample-apiserver", func(tw *tar.Writer) error {
		return writeEntries(tw, []entry{{name: "sample-apiserver", mode: 0o755, src: b.binary("sample-apiserver")}})
	})
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{base, top}, func(cfg *v1.Config) {
		cfg.Entrypoint = []string{"/sample-apiserver"}
	})
}

// pause: /pause alone, as upstream (FROM scratch, USER 65535:65535).
func (b *builder) pause(c imageConfig) (v1.Image, error) {
	l, err := b.layer("pause", func(tw *tar.Writer) error {
		return writeEntries(tw, []entry{{name: "pause", mode: 0o755, src: b.binary("pause")}})
	})
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{l}, func(cfg *v1.Config) {
		cfg.Entrypoint = []string{"/pause"}
		cfg.User = "65535:65535"
	})
}

var (
	etcdPasswd = "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	etcdGroup  = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

// etcd: /usr/local/bin/etcd on a distroless-like root (passwd, group,
// /tmp), as the aggregator spec runs it (command /usr/local/bin/etcd; its
// data goes to default.etcd in the working directory /). No etcdctl:
// k3sm's module does not have it and no spec runs it.
func (b *builder) etcd(c imageConfig) (v1.Image, error) {
	l, err := b.layer("etcd", func(tw *tar.Writer) error {
		return writeEntries(tw, []entry{
			{name: "etc", dir: true}, {name: "tmp", dir: true, mode: 0o1777}, {name: "root", dir: true, mode: 0o700},
			{name: "usr", dir: true}, {name: "usr/local", dir: true}, {name: "usr/local/bin", dir: true},
			{name: "var", dir: true}, {name: "var/lib", dir: true}, {name: "var/lib/etcd", dir: true, mode: 0o700},
			{name: "etc/passwd", mode: 0o644, data: []byte(etcdPasswd)},
			{name: "etc/group", mode: 0o644, data: []byte(etcdGroup)},
			{name: "etc/nsswitch.conf", mode: 0o644, data: []byte(nsswitch)},
			{name: "usr/local/bin/etcd", mode: 0o755, src: b.binary("etcd")},
		})
	})
	if err != nil {
		return nil, err
	}
	return b.image(c, []v1.Layer{l}, func(cfg *v1.Config) {
		cfg.Cmd = []string{"/usr/local/bin/etcd"}
		cfg.ExposedPorts = ports("2379", "2380")
	})
}

// builtImage is one image to write.
type builtImage struct {
	ref  string
	file string
	img  v1.Image
}

// plan resolves every recipe against the manifest.
func (b *builder) plan() ([]recipe, []imageConfig, error) {
	var rs []recipe
	var cs []imageConfig
	for _, r := range recipes {
		c, ok := b.man.images[r.id]
		if r.extra != nil {
			c, ok = *r.extra, true
		}
		if !ok {
			return nil, nil, fmt.Errorf("manifest.go of k8s.io/kubernetes@%s has no image %s: update the recipes in hack/conformance/images", b.k8sVersion, r.id)
		}
		rs = append(rs, r)
		cs = append(cs, c)
	}
	return rs, cs, nil
}
