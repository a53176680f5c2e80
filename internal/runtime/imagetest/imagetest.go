// Package imagetest is test support for the runtime: it builds small static
// Go programs, packs them as OCI images and serves them from a real registry
// on 127.0.0.1 (go-containerregistry's pkg/registry). Nothing is pulled from
// the internet.
package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ProgSource is the test workload: it runs its arguments as a tiny script.
//
//	echo:TEXT   print TEXT on stdout        err:TEXT   print TEXT on stderr
//	sleep:DUR   sleep (Go duration)         exit:N     exit with code N
//	trap:N      on SIGTERM print "got SIGTERM" and exit N
//	trapslow:D  on SIGTERM print "got SIGTERM", keep running D, exit 0
//	ignore      ignore SIGTERM              forever    sleep forever
//	env:NAME    print NAME=value            pwd        print the working dir
//	append:PATH:TEXT  append TEXT and a newline to PATH (host path)
//	spin:DUR    burn CPU for DUR            cat        copy stdin to stdout
//	pid:PATH    write the pid and its pid namespace to PATH (HostPid)
//	failonce:PATH  exit 1 if PATH does not exist (creating it), else go on
//	trapfile:PATH:D  on SIGTERM append "got SIGTERM" to PATH, wait D, exit 0
//	http:PORT:PATH   serve HTTP on :PORT in the background: 200 "ok"
//	                 while PATH does not exist, 500 "unhealthy" once it does
//	tcp:PORT[:PATH]  accept (and close) TCP connections on :PORT in
//	                 the background; stop listening once PATH exists
//	serve:PORT  answer each TCP connection on :PORT with "from <client
//	            address> to <local address>" in the background
//	dial:ADDR   connect to ADDR (host:port), print what it sends (or the
//	            error, exiting 1)
//	relay:PORT:ADDR  answer each TCP connection on :PORT with "relay <local
//	            address> got: " and what ADDR (host:port, dialed then) sent
//	lookup:NAME print NAME's addresses, sorted, one line ("lookup NAME: a b"),
//	            resolved through /etc/resolv.conf; exit 1 on failure
//	udpecho:PORT  echo UDP datagrams on :PORT in the background
//	udp:ADDR:TEXT send TEXT to ADDR over UDP and print the reply
//	rm:PATH     remove PATH (host path)
//	absent:PATH exit 1 (printing "PATH exists") if PATH exists, else go on
//	onterm:PATH:TEXT on SIGTERM append TEXT to PATH and exit 0
//
// More ops live in their own files of the program (progFiles, e.g.
// alloc.go), registered in its extraOps map.
//
// With no arguments it prints "hello from k3sm" and sleeps forever.
const ProgSource = `package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// extraOps are the ops of the program's other files (they register in init).
var extraOps = map[string]func(arg string){}

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		args = []string{"echo:hello from k3sm", "forever"}
	}
	for _, a := range args {
		op, arg, _ := strings.Cut(a, ":")
		switch op {
		case "echo":
			fmt.Println(arg)
		case "err":
			fmt.Fprintln(os.Stderr, arg)
		case "sleep":
			d, _ := time.ParseDuration(arg)
			time.Sleep(d)
		case "exit":
			n, _ := strconv.Atoi(arg)
			os.Exit(n)
		case "trap":
			n, _ := strconv.Atoi(arg)
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGTERM)
			go func() { <-c; fmt.Println("got SIGTERM"); os.Exit(n) }()
		case "trapslow":
			d, _ := time.ParseDuration(arg)
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGTERM)
			go func() { <-c; fmt.Println("got SIGTERM"); time.Sleep(d); os.Exit(0) }()
		case "ignore":
			signal.Ignore(syscall.SIGTERM)
		case "forever":
			for {
				time.Sleep(time.Hour)
			}
		case "env":
			fmt.Printf("%s=%s\n", arg, os.Getenv(arg))
		case "pwd":
			wd, _ := os.Getwd()
			fmt.Println("pwd=" + wd)
		case "append":
			p, text, _ := strings.Cut(arg, ":")
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			fmt.Fprintln(f, text)
			f.Close()
		case "spin":
			d, _ := time.ParseDuration(arg)
			end := time.Now().Add(d)
			for time.Now().Before(end) {
			}
		case "cat":
			io.Copy(os.Stdout, os.Stdin)
		case "http":
			port, flag, _ := strings.Cut(arg, ":")
			l, err := net.Listen("tcp", ":"+port)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
			go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, err := os.Stat(flag); err == nil {
					w.WriteHeader(500)
					fmt.Fprintln(w, "unhealthy")
					return
				}
				fmt.Fprintln(w, "ok")
			}))
		case "tcp":
			port, flag, _ := strings.Cut(arg, ":")
			l, err := net.Listen("tcp", ":"+port)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
			if flag != "" {
				go func() {
					for {
						if _, err := os.Stat(flag); err == nil {
							l.Close()
							return
						}
						time.Sleep(50 * time.Millisecond)
					}
				}()
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		case "serve":
			l, err := net.Listen("tcp", ":"+arg)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					fmt.Fprintf(c, "from %s to %s\n", c.RemoteAddr(), c.LocalAddr())
					c.Close()
				}
			}()
		case "dial":
			c, err := net.DialTimeout("tcp", arg, 5*time.Second)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			io.Copy(os.Stdout, c)
			c.Close()
		case "relay":
			port, target, _ := strings.Cut(arg, ":")
			l, err := net.Listen("tcp", ":"+port)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func(c net.Conn) {
						defer c.Close()
						fmt.Fprintf(c, "relay %s got: ", c.LocalAddr())
						up, err := net.DialTimeout("tcp", target, 5*time.Second)
						if err != nil {
							fmt.Fprintln(c, err)
							return
						}
						io.Copy(c, up)
						up.Close()
					}(c)
				}
			}()
		case "lookup":
			addrs, err := net.LookupHost(arg)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			sort.Strings(addrs)
			fmt.Printf("lookup %s: %s\n", arg, strings.Join(addrs, " "))
		case "udpecho":
			pc, err := net.ListenPacket("udp", ":"+arg)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
			go func() {
				b := make([]byte, 2048)
				for {
					n, from, err := pc.ReadFrom(b)
					if err != nil {
						return
					}
					pc.WriteTo(append([]byte("echo "), b[:n]...), from)
				}
			}()
		case "udp":
			i := strings.LastIndex(arg, ":")
			addr, text := arg[:i], arg[i+1:]
			c, err := net.Dial("udp", addr)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			c.Write([]byte(text))
			b := make([]byte, 2048)
			n, err := c.Read(b)
			if err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			fmt.Println(string(b[:n]))
		case "rm":
			os.Remove(arg)
		case "absent":
			if _, err := os.Stat(arg); err == nil {
				fmt.Println(arg + " exists")
				os.Exit(1)
			}
		case "onterm":
			p, text, _ := strings.Cut(arg, ":")
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGTERM)
			go func() {
				<-c
				f, _ := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				fmt.Fprintln(f, text)
				f.Close()
				os.Exit(0)
			}()
		case "pid":
			// The pid and the pid namespace it is a pid in (a sandboxed
			// pod has its own): imagetest.HostPid translates it.
			ns, _ := os.Readlink("/proc/self/ns/pid")
			os.WriteFile(arg, []byte(strconv.Itoa(os.Getpid())+" "+ns), 0o644)
		case "failonce":
			if _, err := os.Stat(arg); err != nil {
				os.WriteFile(arg, []byte("x"), 0o644)
				fmt.Println("failing once")
				os.Exit(1)
			}
		case "trapfile":
			p, ds, _ := strings.Cut(arg, ":")
			d, _ := time.ParseDuration(ds)
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGTERM)
			go func() {
				<-c
				f, _ := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				fmt.Fprintln(f, "got SIGTERM")
				f.Close()
				time.Sleep(d)
				os.Exit(0)
			}()
		default:
			if f, ok := extraOps[op]; ok {
				f(arg)
				continue
			}
			fmt.Fprintln(os.Stderr, "unknown op", a)
			os.Exit(2)
		}
	}
}
`

// progFiles are the test program's files besides main.go (ProgSource), by
// name; each registers its ops in extraOps from an init function.
var progFiles = map[string]string{}

// BuildProg compiles ProgSource statically for the host platform into dir.
func BuildProg(dir string) (string, error) {
	src := filepath.Join(dir, "progsrc")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module k3smtestprog\n\ngo 1.22\n"), 0o644)
	os.WriteFile(filepath.Join(src, "main.go"), []byte(ProgSource), 0o644)
	for name, text := range progFiles {
		os.WriteFile(filepath.Join(src, name), []byte(text), 0o644)
	}
	out := filepath.Join(dir, "prog")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build test program: %v\n%s", err, b)
	}
	return out, nil
}

// Image packs the binary at bin as /app/prog with Entrypoint ["/app/prog"],
// for the given platform (empty: the host's), with the small system of
// addSystem (busybox as its shell and tools, when installed).
func Image(bin string, platform v1.Platform) (v1.Image, error) {
	return progImage(bin, platform, true)
}

// ImageWithoutShell is Image for the host's platform without busybox: no
// shell and no tools, as a distroless image (kubectl debug's use case).
func ImageWithoutShell(bin string) (v1.Image, error) {
	return progImage(bin, v1.Platform{}, false)
}

func progImage(bin string, platform v1.Platform, tools bool) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(1700000000, 0)
	tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now})
	tw.WriteHeader(&tar.Header{Name: "app/prog", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data)), ModTime: now})
	tw.Write(data)
	tw.WriteHeader(&tar.Header{Name: "app/data/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now})
	msg := []byte("data shipped in the image\n")
	tw.WriteHeader(&tar.Header{Name: "app/data/msg.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(msg)), ModTime: now})
	tw.Write(msg)
	if err := addSystem(tw, now, tools); err != nil {
		return nil, err
	}
	tw.Close()
	if platform.OS == "" {
		platform = v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	}
	return oneLayerImage(buf.Bytes(), func(cf *v1.ConfigFile) {
		cf.OS, cf.Architecture = platform.OS, platform.Architecture
		cf.Config.Entrypoint = []string{"/app/prog"}
		cf.Config.Env = []string{"PATH=/app:/usr/local/bin:/usr/bin:/bin", "FROM_IMAGE=yes"}
		cf.Config.WorkingDir = "/app"
	})
}

// oneLayerImage is an OCI image of one uncompressed-tar layer, its config
// set by configure.
func oneLayerImage(layerBytes []byte, configure func(*v1.ConfigFile)) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (ioReadCloser, error) { return nopCloser{bytes.NewReader(layerBytes)}, nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	configure(cf)
	return mutate.ConfigFile(img, cf)
}

// ForeignPlatform returns a platform that is not the host's.
func ForeignPlatform() v1.Platform {
	if runtime.GOARCH == "arm64" {
		return v1.Platform{OS: "linux", Architecture: "amd64"}
	}
	return v1.Platform{OS: "linux", Architecture: "arm64"}
}

// Registry is a real OCI registry on 127.0.0.1.
type Registry struct {
	Host   string // 127.0.0.1:port
	server *httptest.Server
}

// StartRegistry serves a registry on 127.0.0.1; with user set, every request
// must carry those basic-auth credentials.
func StartRegistry(t testing.TB, user, pass string) *Registry {
	h := registry.New(registry.Logger(nopLogger()))
	if user != "" {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="k3sm-test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	s := httptest.NewServer(h) // listens on 127.0.0.1
	t.Cleanup(s.Close)
	return &Registry{Host: strings.TrimPrefix(s.URL, "http://"), server: s}
}

// Push pushes img as ref (relative to the registry, e.g. "prog:v1") and
// returns the full reference.
func (r *Registry) Push(t testing.TB, ref string, img v1.Image, opts ...remote.Option) string {
	t.Helper()
	full := r.Host + "/" + ref
	tag, err := name.ParseReference(full)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatalf("push %s: %v", full, err)
	}
	return full
}

// PlatformImage is one entry of an index.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// PushIndex pushes an index holding imgs (each with its platform).
func (r *Registry) PushIndex(t testing.TB, ref string, imgs ...PlatformImage) string {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, pi := range imgs {
		p := pi.Platform
		adds = append(adds, mutate.IndexAddendum{Add: pi.Image, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	full := r.Host + "/" + ref
	tag, err := name.ParseReference(full)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatalf("push index %s: %v", full, err)
	}
	return full
}
