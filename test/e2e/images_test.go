package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	corev1 "k8s.io/api/core/v1"
)

type lsRow struct {
	ID       string   `json:"id"`
	RepoTags []string `json:"repoTags"`
	UsedBy   []string `json:"usedBy"`
}

// The image commands on a running server's store: load a docker-archive
// and run it with imagePullPolicy Never, build a COPY-only Dockerfile and
// run it, RUN refused, pull and push with progress against a registry on
// 127.0.0.1, tag/inspect/save/untag, prune sparing a pod's image, and ls
// with the server stopped (the store opened directly).
func TestImages(t *testing.T) {
	work := t.TempDir()
	bin, err := imagetest.BuildProg(work)
	if err != nil {
		t.Fatal(err)
	}
	img, err := imagetest.Image(bin, v1.Platform{})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := img.Digest()
	cfgName, _ := img.ConfigName()
	// A docker-archive keeps the config and layers, not the manifest: the
	// loaded image's id is the manifest k3sm writes for it.
	var loadedID string
	reg := imagetest.StartRegistry(t, "", "")
	remoteRef := reg.Push(t, "prog:v1", img)
	archive := filepath.Join(work, "prog.tar")
	tag, _ := name.NewTag("local/prog:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}

	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)
	dd := []string{"--data-dir", s.dataDir}
	img_ := func(t *testing.T, args ...string) string {
		t.Helper()
		return mustK3sm(t, 2*time.Minute, append(append([]string{"image"}, args...), dd...)...)
	}
	ls := func(t *testing.T) map[string]lsRow {
		t.Helper()
		var rows []lsRow
		if err := json.Unmarshal([]byte(img_(t, "ls", "-o", "json")), &rows); err != nil {
			t.Fatal(err)
		}
		out := map[string]lsRow{}
		for _, r := range rows {
			for _, tg := range r.RepoTags {
				out[tg] = r
			}
			out[r.ID] = r
		}
		return out
	}
	runPod := func(t *testing.T, podName, image, want string, args ...string) {
		t.Helper()
		p := nativePod(podName, image, args...)
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		s.createPod(t, p)
		waitPod(t, c, podName, 90*time.Second, running)
		waitFor(t, 30*time.Second, "logs of "+podName, func() error {
			out, err := s.kubectl("logs", podName)
			if err != nil || !strings.Contains(out, want) {
				return fmt.Errorf("logs %q (%v), want %q", out, err, want)
			}
			return nil
		})
	}

	t.Run("load a docker-archive, ls, a pod runs it with pullPolicy Never", func(t *testing.T) {
		out := img_(t, "load", "-i", archive)
		if !strings.Contains(out, "Loaded image: index.docker.io/local/prog:v1 sha256:") {
			t.Fatalf("load: %s", out)
		}
		rows := ls(t)
		r, ok := rows["index.docker.io/local/prog:v1"]
		if !ok {
			t.Fatalf("ls: %v", rows)
		}
		loadedID = r.ID
		var insp struct {
			Manifest v1.Manifest `json:"manifest"`
		}
		json.Unmarshal([]byte(img_(t, "inspect", "local/prog:v1")), &insp)
		if insp.Manifest.Config.Digest != cfgName {
			t.Fatalf("loaded config %s, want %s", insp.Manifest.Config.Digest, cfgName)
		}
		runPod(t, "loaded", "local/prog:v1", "from the archive", "echo:from the archive", "forever")
		if r := ls(t)[loadedID]; len(r.UsedBy) != 1 || r.UsedBy[0] != "default/loaded" {
			t.Fatalf("ls usedBy: %+v", r)
		}
		table := img_(t, "ls")
		if !strings.Contains(table, "index.docker.io/local/prog") || !strings.Contains(table, loadedID[7:19]) || !strings.Contains(table, "default/loaded") {
			t.Fatalf("ls table:\n%s", table)
		}
	})

	t.Run("import an OCI layout directory", func(t *testing.T) {
		dir := filepath.Join(work, "layout")
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "oci/prog:v3"})); err != nil {
			t.Fatal(err)
		}
		out := img_(t, "import", dir)
		if !strings.Contains(out, "Loaded image: index.docker.io/oci/prog:v3 "+id.String()) {
			t.Fatalf("import: %s", out)
		}
		if r := ls(t)["index.docker.io/oci/prog:v3"]; r.ID != id.String() {
			t.Fatalf("ls after import: %v", ls(t))
		}
	})

	t.Run("build a COPY-only Dockerfile, a pod runs it", func(t *testing.T) {
		dir := filepath.Join(work, "ctx")
		os.MkdirAll(filepath.Join(dir, "conf"), 0o755)
		data, _ := os.ReadFile(bin)
		os.WriteFile(filepath.Join(dir, "prog"), data, 0o755)
		os.WriteFile(filepath.Join(dir, "conf", "greeting.txt"), []byte("hi"), 0o644)
		os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(`ARG DIR=/srv
FROM scratch
ARG DIR
COPY --chown=1000:1000 prog ${DIR}/prog
COPY conf/ /etc/app/
ENV GREETING=built MODE="a b"
WORKDIR ${DIR}
LABEL org.example.team=k3sm
EXPOSE 8080
USER 1000
ENTRYPOINT ["/srv/prog"]
CMD ["env:GREETING", "pwd", "forever"]
`), 0o644)
		out, err := k3sm(t, 2*time.Minute, append([]string{"image", "build", "-t", "built:v1", dir}, dd...)...)
		if err != nil || !strings.Contains(out, "Step 12/12") || !strings.Contains(out, "Built index.docker.io/library/built:v1") {
			t.Fatalf("build: %v\n%s", err, out)
		}
		var insp struct {
			Config v1.ConfigFile `json:"config"`
		}
		if err := json.Unmarshal([]byte(img_(t, "inspect", "built:v1")), &insp); err != nil {
			t.Fatal(err)
		}
		cfg := insp.Config.Config
		if cfg.WorkingDir != "/srv" || cfg.User != "1000" || cfg.Labels["org.example.team"] != "k3sm" || len(cfg.ExposedPorts) != 1 ||
			!strings.Contains(strings.Join(cfg.Env, ","), "MODE=a b") || len(insp.Config.RootFS.DiffIDs) != 2 {
			t.Fatalf("built config: %+v rootfs %+v", cfg, insp.Config.RootFS)
		}
		runPod(t, "built", "built:v1", "GREETING=built")
		out, _ = s.kubectl("logs", "built")
		// A native pod's working dir is WORKDIR inside its root.
		if !regexp.MustCompile(`pwd=\S*/srv\n`).MatchString(out) {
			t.Fatalf("workdir: %s", out)
		}
	})

	t.Run("build refuses RUN naming the line", func(t *testing.T) {
		dir := filepath.Join(work, "runctx")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nRUN make\n"), 0o644)
		out, err := k3sm(t, time.Minute, append([]string{"image", "build", "-t", "x:v1", dir}, dd...)...)
		if err == nil || !strings.Contains(out, "Dockerfile:2: RUN is not supported") || !strings.Contains(out, "COPY it") {
			t.Fatalf("RUN: %v\n%s", err, out)
		}
	})

	t.Run("pull from a loopback registry with progress", func(t *testing.T) {
		out := img_(t, "pull", remoteRef)
		if !strings.Contains(out, "pull "+remoteRef+":") || !strings.Contains(out, "100%") || !strings.Contains(out, remoteRef+" "+id.String()) {
			t.Fatalf("pull: %s", out)
		}
		if r := ls(t)[remoteRef]; r.ID != id.String() {
			t.Fatalf("ls after pull: %+v", ls(t))
		}
	})

	t.Run("push to a loopback registry with progress", func(t *testing.T) {
		target := reg.Host + "/pushed:v2"
		out := img_(t, "push", "built:v1", target)
		if !strings.Contains(out, "push "+target+":") || !strings.Contains(out, "100%") {
			t.Fatalf("push: %s", out)
		}
		ref, _ := name.ParseReference(target)
		desc, err := remote.Get(ref)
		if err != nil {
			t.Fatal(err)
		}
		if built := ls(t)["index.docker.io/library/built:v1"]; desc.Digest.String() != built.ID {
			t.Fatalf("pushed %s, stored %s", desc.Digest, built.ID)
		}
	})

	t.Run("tag, inspect, save, untag", func(t *testing.T) {
		img_(t, "tag", "local/prog:v1", "again:v1")
		if r := ls(t)["index.docker.io/library/again:v1"]; r.ID != loadedID {
			t.Fatalf("tag: %+v", ls(t))
		}
		var insp struct {
			Image    lsRow         `json:"image"`
			Manifest v1.Manifest   `json:"manifest"`
			Config   v1.ConfigFile `json:"config"`
		}
		if err := json.Unmarshal([]byte(img_(t, "inspect", "again:v1")), &insp); err != nil {
			t.Fatal(err)
		}
		if insp.Image.ID != loadedID || insp.Config.Config.Entrypoint[0] != "/app/prog" || len(insp.Manifest.Layers) == 0 {
			t.Fatalf("inspect: %+v", insp)
		}
		saved := filepath.Join(work, "saved.tar")
		img_(t, "save", "again:v1", "-o", saved)
		back, err := tarball.ImageFromPath(saved, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := back.ConfigName(); d != cfgName {
			t.Fatalf("saved image config %s, want %s", d, cfgName)
		}
		if out := img_(t, "untag", "again:v1"); !strings.Contains(out, "Untagged: again:v1") {
			t.Fatalf("untag: %s", out)
		}
		if _, ok := ls(t)["index.docker.io/library/again:v1"]; ok {
			t.Fatal("again:v1 still listed")
		}
		// The last name of an image a pod runs is not removed without --force.
		out, err := k3sm(t, time.Minute, append([]string{"image", "rm", "built:v1"}, dd...)...)
		if err == nil || !strings.Contains(out, "used by pod default/built") {
			t.Fatalf("rm of a used image: %v %s", err, out)
		}
	})

	t.Run("prune frees an unused image, not a pod's", func(t *testing.T) {
		dir := filepath.Join(work, "unused")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "big"), make([]byte, 3<<20), 0o644)
		os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY big /big\n"), 0o644)
		blobDir := filepath.Join(s.dataDir, "images", "blobs", "sha256")
		before := map[string]bool{}
		if bs, err := os.ReadDir(blobDir); err == nil {
			for _, b := range bs {
				before[b.Name()] = true
			}
		}
		img_(t, "build", "-t", "unused:v1", dir)
		var only []string // the blobs only the unused image has
		bs, _ := os.ReadDir(blobDir)
		for _, b := range bs {
			if !before[b.Name()] {
				only = append(only, b.Name())
			}
		}
		if len(only) == 0 {
			t.Fatal("building the unused image stored no blob")
		}
		unused := ls(t)["index.docker.io/library/unused:v1"].ID
		df := img_(t, "df", "-o", "json")
		var d struct {
			Reclaimable uint64 `json:"reclaimableBytes"`
		}
		json.Unmarshal([]byte(df), &d)
		if d.Reclaimable < 3<<20 {
			t.Fatalf("df: %s", df)
		}
		out := img_(t, "prune")
		if !strings.Contains(out, "Deleted: "+strings.TrimPrefix(unused, "sha256:")[:12]) {
			t.Fatalf("prune: %s", out)
		}
		rows := ls(t)
		if _, ok := rows[unused]; ok {
			t.Fatalf("unused image survived prune: %v", rows)
		}
		if _, ok := rows[loadedID]; !ok {
			t.Fatal("prune removed the image pod loaded runs")
		}
		if _, ok := rows["index.docker.io/library/built:v1"]; !ok {
			t.Fatal("prune removed the image pod built runs")
		}
		for _, b := range only {
			if _, err := os.Stat(filepath.Join(blobDir, b)); err == nil {
				t.Fatalf("the pruned image's blob %s is still stored", b)
			}
		}
	})

	t.Run("ls with the server stopped opens the store", func(t *testing.T) {
		s.deletePod(t, "loaded", 0)
		s.deletePod(t, "built", 0)
		s.stop()
		if r := ls(t)["index.docker.io/local/prog:v1"]; r.ID != loadedID {
			t.Fatalf("offline ls: %+v", ls(t))
		}
		out, err := k3sm(t, time.Minute, "image", "ls", "--data-dir", filepath.Join(work, "nothing"))
		if err == nil || !strings.Contains(out, "no k3sm cluster at") {
			t.Fatalf("no cluster: %v %s", err, out)
		}
	})
}

// --registry-port serves a registry backed by the image store: an image
// pushed there with go-containerregistry (what crane push does) is listed,
// pods naming 127.0.0.1:PORT/... and localhost:PORT/... (pulled over HTTP,
// pullPolicy Always) run it, and the store holds each blob once.
func TestNodeRegistry(t *testing.T) {
	s, img, port := registryServer(t)
	host := fmt.Sprintf("127.0.0.1:%d", port)
	c := s.client()
	ref, _ := name.ParseReference(host + "/app:v1")
	waitFor(t, 30*time.Second, "push to the node registry", func() error { return remote.Write(ref, img) })
	out := mustK3sm(t, time.Minute, "image", "ls", "--data-dir", s.dataDir)
	if !strings.Contains(out, host+"/app") {
		t.Fatalf("pushed image not listed:\n%s", out)
	}
	for _, tc := range []struct {
		pod, image string
		policy     corev1.PullPolicy
	}{{"reg-ip", host + "/app:v1", corev1.PullIfNotPresent}, {"reg-localhost", fmt.Sprintf("localhost:%d/app:v1", port), corev1.PullAlways}} {
		p := nativePod(tc.pod, tc.image, "echo:from the node registry", "forever")
		p.Spec.Containers[0].ImagePullPolicy = tc.policy
		s.createPod(t, p)
		waitPod(t, c, tc.pod, 90*time.Second, running)
		waitFor(t, 30*time.Second, "logs of "+tc.pod, func() error {
			out, err := s.kubectl("logs", tc.pod)
			if err != nil || !strings.Contains(out, "from the node registry") {
				return fmt.Errorf("logs %q (%v)", out, err)
			}
			return nil
		})
	}
	m, _ := img.Manifest()
	blobs, _ := os.ReadDir(filepath.Join(s.dataDir, "images", "blobs", "sha256"))
	if len(blobs) != len(m.Layers)+1 {
		var names []string
		for _, b := range blobs {
			names = append(names, b.Name())
		}
		t.Fatalf("store holds %d blobs %v, want %d (the layers and config once)", len(blobs), names, len(m.Layers)+1)
	}
	trees, _ := os.ReadDir(filepath.Join(s.dataDir, "images", "sha256"))
	if len(trees) != 1 {
		t.Fatalf("%d unpacked trees, want 1", len(trees))
	}
	s.deletePod(t, "reg-ip", 0)
	s.deletePod(t, "reg-localhost", 0)

	// A multi-platform index (this node's image and another platform's)
	// and a push by digest only: no image of the store, kept by the
	// registry's journal.
	foreignArch := "s390x"
	if runtime.GOARCH == foreignArch {
		foreignArch = "arm64"
	}
	foreign, _ := random.Image(1024, 1)
	fcf, _ := foreign.ConfigFile()
	fcf = fcf.DeepCopy()
	fcf.OS, fcf.Architecture = "linux", foreignArch
	foreign, _ = mutate.ConfigFile(foreign, fcf)
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: foreignArch}}},
	), types.OCIImageIndex)
	idxRef, _ := name.ParseReference(host + "/multi:v1")
	if err := remote.WriteIndex(idxRef, idx); err != nil {
		t.Fatalf("push an index: %v", err)
	}
	loose, _ := random.Image(1024, 1)
	looseRef, _ := name.ParseReference(host + "/loose@" + must(loose.Digest()).String())
	if err := remote.Write(looseRef, loose); err != nil {
		t.Fatalf("push by digest: %v", err)
	}

	// Kept across a restart: the registry serves what the store holds and
	// what its journal holds, whole.
	s.stop()
	s.start()
	waitFor(t, 30*time.Second, "manifest after restart", func() error { _, err := remote.Get(ref); return err })
	got, err := remote.Index(idxRef)
	if err != nil {
		t.Fatalf("the index after a restart: %v", err)
	}
	if err := validate.Index(got); err != nil {
		t.Fatalf("the index after a restart does not verify: %v", err)
	}
	gotLoose, err := remote.Image(looseRef)
	if err != nil {
		t.Fatalf("the push by digest after a restart: %v", err)
	}
	if err := validate.Image(gotLoose); err != nil {
		t.Fatalf("the push by digest after a restart does not verify: %v", err)
	}
	// A pod pulls the index and runs this node's image of it.
	p := nativePod("reg-index", fmt.Sprintf("localhost:%d/multi:v1", port), "echo:from the index", "forever")
	p.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
	s.createPod(t, p)
	waitPod(t, s.client(), "reg-index", 90*time.Second, running)
	waitFor(t, 30*time.Second, "logs of reg-index", func() error {
		out, err := s.kubectl("logs", "reg-index")
		if err != nil || !strings.Contains(out, "from the index") {
			return fmt.Errorf("logs %q (%v)", out, err)
		}
		return nil
	})
	s.deletePod(t, "reg-index", 0)
}

func must(h v1.Hash, err error) v1.Hash {
	if err != nil {
		panic(err)
	}
	return h
}

// The real docker CLI pushes to the node registry: dockerd runs outside
// this test's network namespace (TestMain made one), so, as a VM's engine
// does through a relay, it reaches the registry by a relay on another
// loopback port in dockerd's namespace. The image is stored under
// 127.0.0.1:PORT whatever host name docker pushed to; after a restart a pod
// naming 127.0.0.1:PORT/app:v1 runs it, and docker pulls it back.
func TestNodeRegistryDockerPush(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the relay enters dockerd's network namespace")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker CLI (hack/start-docker.sh installs one)")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (hack/start-docker.sh starts one): %v %s", err, out)
	}
	dockerd := dockerdPid()
	if dockerd == 0 {
		t.Skip("no local dockerd process: the engine is elsewhere, its network namespace out of reach")
	}
	docker := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}

	s, img, port := registryServer(t)
	host := fmt.Sprintf("127.0.0.1:%d", port)
	relay := relayFromNetNS(t, fmt.Sprintf("/proc/%d/ns/net", dockerd), host)
	t.Logf("dockerd (pid %d) pushes through %s to the registry on %s", dockerd, relay, host)

	// A docker-archive the test made, loaded: nothing comes from a
	// public registry.
	local := fmt.Sprintf("k3sm-e2e-docker-push:%d", port)
	pushed := relay + "/app:v1"
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", local, pushed).Run() })
	archive := filepath.Join(t.TempDir(), "app.tar")
	tag, _ := name.NewTag(local)
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	docker("load", "-i", archive)
	id := docker("image", "inspect", "--format", "{{.Id}}", local)
	docker("tag", local, pushed)
	waitFor(t, 30*time.Second, "docker push", func() error {
		if out, err := exec.Command("docker", "push", pushed).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	out := mustK3sm(t, time.Minute, "image", "ls", "--data-dir", s.dataDir)
	if !strings.Contains(out, host+"/app") || strings.Contains(out, relay+"/app") {
		t.Fatalf("pushed through %s: want it stored as %s/app:v1, store has:\n%s", relay, host, out)
	}

	// After a restart the store and the registry have it under
	// 127.0.0.1:PORT.
	s.stop()
	s.start()
	p := nativePod("reg-docker", host+"/app:v1", "echo:pushed by docker", "forever")
	p.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	s.createPod(t, p)
	waitPod(t, s.client(), "reg-docker", 90*time.Second, running)
	waitFor(t, 30*time.Second, "logs of reg-docker", func() error {
		out, err := s.kubectl("logs", "reg-docker")
		if err != nil || !strings.Contains(out, "pushed by docker") {
			return fmt.Errorf("logs %q (%v)", out, err)
		}
		return nil
	})
	s.deletePod(t, "reg-docker", 0)

	docker("rmi", local, pushed)
	docker("pull", pushed)
	if got := docker("image", "inspect", "--format", "{{.Id}}", pushed); got != id {
		t.Fatalf("docker pulled back %s, pushed %s", got, id)
	}
}

// dockerdPid is the local dockerd's pid, 0 if none runs here.
func dockerdPid() int {
	if b, err := os.ReadFile("/var/run/docker.pid"); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "dockerd" {
				return pid
			}
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); strings.TrimSpace(string(comm)) == "dockerd" {
			return pid
		}
	}
	return 0
}

// relayFromNetNS listens on 127.0.0.1 in the network namespace nsPath and
// forwards each connection to target on this process's 127.0.0.1; it
// returns the address it listens on there, never target's port, so clients
// there use another host name than the registry's. In this process's own
// namespace it listens here.
func relayFromNetNS(t *testing.T, nsPath, target string) string {
	t.Helper()
	listen := func() (net.Listener, error) {
		for {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil || ln.Addr().String() != target {
				return ln, err
			}
			defer ln.Close() // target's port is free there: take another
		}
	}
	var self, there syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(nsPath, &there); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	var err error
	if self.Ino == there.Ino && self.Dev == there.Dev {
		ln, err = listen()
	} else {
		// The socket stays in that namespace.
		err = inNetNS(nsPath, func() (err error) {
			ln, err = listen()
			return err
		})
	}
	if err != nil {
		t.Fatalf("relay in %s: %v", nsPath, err)
	}
	t.Cleanup(func() { ln.Close() })
	// Dialed from an unlocked goroutine: this process's namespace.
	imagetest.ForwardTCP(ln, target)
	return ln.Addr().String()
}

// registryServer starts a server with --registry-port and builds the
// image the registry tests push: the server, the image and the
// registry's port.
func registryServer(t *testing.T) (*server, v1.Image, int) {
	t.Helper()
	img := progImage(t)
	port := freePort(t)
	s := newServer(t, "--registry-port", fmt.Sprint(port))
	s.start()
	s.deletePodsAtCleanup(t)
	return s, img, port
}
