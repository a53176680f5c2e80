package k3smcmd

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/spf13/cobra"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/tartree"
)

func imageBuild(with runner) *cobra.Command {
	var tags, buildArgs []string
	var file string
	cmd := &cobra.Command{
		Use:   "build -t NAME [-f Dockerfile] CONTEXT",
		Short: "Build an image from a Dockerfile that only FROMs an image and adds files (no RUN)",
		Long: "Instructions: FROM (a stored image, a registry image, or scratch), COPY/ADD of files from CONTEXT\n" +
			"(--chown=UID[:GID]), ENV, WORKDIR, ENTRYPOINT, CMD, EXPOSE, USER, LABEL, ARG (--build-arg). RUN is refused:\n" +
			"pods run as native processes, so there is no container to run build steps in; build the program on\n" +
			"the host and COPY it. Each COPY/ADD is one layer; the image goes into the store, runnable by a pod.",
		Args: cobra.ExactArgs(1),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			if len(tags) == 0 {
				return fmt.Errorf("-t/--tag is required: name the image, e.g. -t app:v1")
			}
			for _, t := range tags {
				if _, err := name.NewTag(t); err != nil {
					return fmt.Errorf("-t %q: %v", t, err)
				}
			}
			if file == "" {
				file = filepath.Join(args[0], "Dockerfile")
			}
			b := &builder{ctxDir: args[0], file: file, out: cmd.ErrOrStderr(), c: c, cmd: cmd, args: map[string]string{}}
			for _, a := range buildArgs {
				k, v, ok := strings.Cut(a, "=")
				if !ok {
					v, ok = os.LookupEnv(k)
				}
				if ok {
					b.args[k] = v
				}
			}
			img, err := b.build()
			if err != nil {
				return err
			}
			tag, _ := name.NewTag(tags[0])
			stream, err := c.LoadImage(cmd.Context())
			if err != nil {
				return grpcErr(err)
			}
			if err := stream.Send(&runtimev1.LoadImageRequest{Tags: tags[1:]}); err != nil {
				return grpcErr(err)
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(tarball.Write(tag, img, pw)) }()
			buf := make([]byte, 1<<20)
			for {
				n, rerr := pr.Read(buf)
				if n > 0 {
					if stream.Send(&runtimev1.LoadImageRequest{Chunk: buf[:n]}) != nil {
						break
					}
				}
				if rerr == io.EOF {
					break
				}
				if rerr != nil {
					return rerr
				}
			}
			resp, err := stream.CloseAndRecv()
			if err != nil {
				return grpcErr(err)
			}
			for _, i := range resp.GetImages() {
				fmt.Fprintf(cmd.OutOrStdout(), "Built %s %s\n", strings.Join(i.GetRepoTags(), ", "), i.GetId())
			}
			return nil
		}),
	}
	cmd.Flags().StringSliceVarP(&tags, "tag", "t", nil, "name of the image (repeatable)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "the Dockerfile (default CONTEXT/Dockerfile)")
	cmd.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "set an ARG: NAME=VALUE (NAME alone takes it from the environment)")
	return cmd
}

type builder struct {
	ctxDir, file string
	out          io.Writer
	c            *imageConn
	cmd          *cobra.Command
	args         map[string]string // --build-arg
	vars         map[string]string // ARG and ENV in scope
	ignore       *contextIgnore
	lex          *shell.Lex
}

// envs is the variables a word is expanded with.
type envs map[string]string

func (e envs) Get(k string) (string, bool) { v, ok := e[k]; return v, ok }
func (e envs) Keys() []string {
	var out []string
	for k := range e {
		out = append(out, k)
	}
	return out
}

func (b *builder) expand(word string) (string, error) {
	s, _, err := b.lex.ProcessWord(word, envs(b.vars))
	return s, err
}

func (b *builder) build() (v1.Image, error) {
	f, err := os.Open(b.file)
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	res, err := parser.Parse(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.file, err)
	}
	b.lex = shell.NewLex(res.EscapeToken)
	b.vars = map[string]string{}
	nodes := res.AST.Children
	// Refuse what cannot be built before doing anything.
	froms := 0
	for _, n := range nodes {
		n.Value = strings.ToLower(n.Value)
		switch n.Value {
		case "run":
			return nil, fmt.Errorf("%s:%d: RUN is not supported: k3sm runs pods as native processes, so there is no container to run a build step in; build the program on the host (e.g. CGO_ENABLED=0 go build) and COPY it into the image", b.file, n.StartLine)
		case "from":
			froms++
		case "copy", "add", "env", "workdir", "entrypoint", "cmd", "expose", "user", "label", "arg":
		default:
			return nil, fmt.Errorf("%s:%d: %s is not supported by k3sm image build (supported: FROM, COPY, ADD, ENV, WORKDIR, ENTRYPOINT, CMD, EXPOSE, USER, LABEL, ARG)", b.file, n.StartLine, strings.ToUpper(n.Value))
		}
	}
	if froms != 1 {
		return nil, fmt.Errorf("%s: %d FROM instructions: k3sm image build takes exactly one (no multi-stage builds)", b.file, froms)
	}
	if b.ignore, err = loadIgnore(b.ctxDir, b.file); err != nil {
		return nil, err
	}
	if b.ignore.file != "" {
		fmt.Fprintf(b.out, "Using %s: %d patterns leave files out of the context\n", b.ignore.file, b.ignore.n)
	}
	var img v1.Image
	var cfg *v1.ConfigFile
	var layers []v1.Layer
	history := []v1.History{}
	for i, n := range nodes {
		words := []string{}
		for a := n.Next; a != nil; a = a.Next {
			words = append(words, a.Value)
		}
		fmt.Fprintf(b.out, "Step %d/%d : %s\n", i+1, len(nodes), n.Original)
		loc := fmt.Sprintf("%s:%d", b.file, n.StartLine)
		if img == nil && n.Value != "from" && n.Value != "arg" {
			return nil, fmt.Errorf("%s: %s before FROM", loc, strings.ToUpper(n.Value))
		}
		switch n.Value {
		case "arg":
			for _, w := range words {
				k, v, hasDefault := strings.Cut(w, "=")
				if given, ok := b.args[k]; ok {
					v = given
				} else if !hasDefault {
					continue
				}
				if hasDefault {
					if v, err = b.expand(v); err != nil {
						return nil, fmt.Errorf("%s: %w", loc, err)
					}
				}
				b.vars[k] = v
			}
			continue
		case "from":
			if len(n.Flags) > 0 {
				return nil, fmt.Errorf("%s: FROM %s is not supported (the image must be for this node's platform)", loc, strings.Join(n.Flags, " "))
			}
			if len(words) != 1 {
				return nil, fmt.Errorf("%s: FROM takes one image (no AS: multi-stage builds are not supported)", loc)
			}
			ref, err := b.expand(words[0])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", loc, err)
			}
			if img, err = b.base(ref); err != nil {
				return nil, fmt.Errorf("%s: FROM %s: %w", loc, ref, err)
			}
			if cfg, err = img.ConfigFile(); err != nil {
				return nil, err
			}
			cfg = cfg.DeepCopy()
			if cfg.OS == "" {
				cfg.OS, cfg.Architecture = goos(), goarch()
			}
			for _, e := range cfg.Config.Env {
				if k, v, ok := strings.Cut(e, "="); ok {
					b.vars[k] = v
				}
			}
			continue
		case "copy", "add":
			l, err := b.copyLayer(n.Value, n.Flags, words, cfg.Config.WorkingDir, n.Attributes["json"], loc)
			if err != nil {
				return nil, err
			}
			layers = append(layers, l)
		case "env":
			// The parser gives key, value, separator triples.
			for j := 0; j+1 < len(words); j += 3 {
				v, err := b.expand(words[j+1])
				if err != nil {
					return nil, fmt.Errorf("%s: %w", loc, err)
				}
				b.vars[words[j]] = v
				cfg.Config.Env = setEnv(cfg.Config.Env, words[j], v)
			}
		case "label":
			if cfg.Config.Labels == nil {
				cfg.Config.Labels = map[string]string{}
			}
			for j := 0; j+1 < len(words); j += 3 {
				k, _ := b.expand(words[j])
				v, _ := b.expand(words[j+1])
				cfg.Config.Labels[k] = v
			}
		case "workdir":
			w, err := b.expand(strings.Join(words, " "))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", loc, err)
			}
			if !path.IsAbs(w) {
				w = path.Join("/", cfg.Config.WorkingDir, w)
			}
			cfg.Config.WorkingDir = path.Clean(w)
		case "entrypoint", "cmd":
			argv := words
			if !n.Attributes["json"] {
				argv = []string{"/bin/sh", "-c", strings.Join(words, " ")}
			}
			if n.Value == "entrypoint" {
				cfg.Config.Entrypoint = argv
				cfg.Config.Cmd = nil // as docker: a new entrypoint drops the base's CMD
			} else {
				cfg.Config.Cmd = argv
			}
		case "expose":
			if cfg.Config.ExposedPorts == nil {
				cfg.Config.ExposedPorts = map[string]struct{}{}
			}
			for _, w := range words {
				p, err := b.expand(w)
				if err != nil {
					return nil, err
				}
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				num, _, _ := strings.Cut(p, "/")
				if _, err := strconv.ParseUint(num, 10, 16); err != nil {
					return nil, fmt.Errorf("%s: EXPOSE %s: not a port number", loc, w)
				}
				cfg.Config.ExposedPorts[p] = struct{}{}
			}
		case "user":
			u, err := b.expand(strings.Join(words, " "))
			if err != nil {
				return nil, err
			}
			cfg.Config.User = u
		}
		history = append(history, v1.History{CreatedBy: n.Original, EmptyLayer: n.Value != "copy" && n.Value != "add"})
	}
	now := v1.Time{Time: time.Now().UTC().Truncate(time.Second)}
	cfg.Created = now
	for i := range history {
		history[i].Created = now
	}
	var adds []mutate.Addendum
	li := 0
	for _, h := range history {
		if h.EmptyLayer {
			cfg.History = append(cfg.History, h)
			continue
		}
		adds = append(adds, mutate.Addendum{Layer: layers[li], History: h})
		li++
	}
	out, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	// Append recorded the layers' history; keep it and add the empty ones.
	withLayers, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg.RootFS = withLayers.RootFS
	cfg.History = append(withLayers.History, cfg.History...)
	return mutate.ConfigFile(out, cfg)
}

func setEnv(env []string, k, v string) []string {
	for i, e := range env {
		if strings.HasPrefix(e, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// base is the FROM image: scratch, a stored image, else pulled into the
// store (registries.yaml applies) and read back as a docker-archive.
func (b *builder) base(ref string) (v1.Image, error) {
	if ref == "scratch" {
		return empty.Image, nil
	}
	ctx := b.cmd.Context()
	if _, err := b.c.InspectImage(ctx, &runtimev1.InspectImageRequest{Image: ref}); err != nil {
		stream, err := b.c.PullImageProgress(ctx, &runtimev1.PullImageRequest{Image: ref})
		if err != nil {
			return nil, grpcErr(err)
		}
		if _, err := followProgress(stream.Recv, newProgressBar(b.out, "pull "+ref)); err != nil {
			return nil, err
		}
	}
	f, err := os.CreateTemp("", "k3sm-build-base-*.tar")
	if err != nil {
		return nil, err
	}
	// Unlinked at once: the open file keeps the data while the build reads it.
	defer os.Remove(f.Name())
	stream, err := b.c.SaveImage(ctx, &runtimev1.SaveImageRequest{Images: []string{ref}})
	if err != nil {
		return nil, grpcErr(err)
	}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, grpcErr(err)
		}
		if _, err := f.Write(m.GetChunk()); err != nil {
			return nil, err
		}
	}
	data, err := os.ReadFile(f.Name())
	f.Close()
	if err != nil {
		return nil, err
	}
	return tarball.Image(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, nil)
}

// copyLayer makes the layer of one COPY/ADD: sources inside the context
// (globs allowed), the destination relative to WORKDIR; a destination
// ending in / or several sources make a directory.
func (b *builder) copyLayer(verb string, flags, words []string, workdir string, _ bool, loc string) (v1.Layer, error) {
	uid, gid := 0, 0
	for _, fl := range flags {
		k, v, _ := strings.Cut(strings.TrimPrefix(fl, "--"), "=")
		switch k {
		case "chown":
			u, g, hasG := strings.Cut(v, ":")
			var err error
			if uid, err = strconv.Atoi(u); err != nil {
				return nil, fmt.Errorf("%s: --chown=%s: give a numeric UID[:GID] (names need the image's /etc/passwd, which k3sm image build does not read)", loc, v)
			}
			gid = uid
			if hasG {
				if gid, err = strconv.Atoi(g); err != nil {
					return nil, fmt.Errorf("%s: --chown=%s: give a numeric GID", loc, v)
				}
			}
		case "chmod":
		default:
			return nil, fmt.Errorf("%s: %s %s is not supported (only --chown and --chmod; --from needs a multi-stage build)", loc, strings.ToUpper(verb), fl)
		}
	}
	var chmod *fs.FileMode
	for _, fl := range flags {
		if v, ok := strings.CutPrefix(fl, "--chmod="); ok {
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: --chmod=%s: give an octal mode such as 0755", loc, v)
			}
			mm := fs.FileMode(m)
			chmod = &mm
		}
	}
	if len(words) < 2 {
		return nil, fmt.Errorf("%s: %s needs a source and a destination", loc, strings.ToUpper(verb))
	}
	for i := range words {
		w, err := b.expand(words[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", loc, err)
		}
		words[i] = w
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	if !path.IsAbs(dest) {
		dest = path.Join("/", workdir, dest) + map[bool]string{true: "/"}[strings.HasSuffix(dest, "/")]
	}
	ctxAbs, err := filepath.Abs(b.ctxDir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, s := range srcs {
		if strings.Contains(s, "://") {
			return nil, fmt.Errorf("%s: %s of a URL (%s) is not supported: download it into the build context and COPY it", loc, strings.ToUpper(verb), s)
		}
		if verb == "add" && (strings.HasSuffix(s, ".tar") || strings.Contains(s, ".tar.") || strings.HasSuffix(s, ".tgz")) {
			return nil, fmt.Errorf("%s: ADD of an archive (%s) would unpack it, which k3sm image build does not do: extract it in the build context and COPY the directory", loc, s)
		}
		matches, err := filepath.Glob(filepath.Join(ctxAbs, filepath.FromSlash(path.Clean("/"+s))))
		if err != nil {
			return nil, fmt.Errorf("%s: source %s: %w", loc, s, err)
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("%s: source %s: no such file in the build context %s", loc, s, b.ctxDir)
		}
		kept := matches[:0]
		for _, m := range matches {
			rel, _ := filepath.Rel(ctxAbs, m)
			ex, err := b.ignore.excluded(rel)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", loc, b.ignore.file, err)
			}
			// An excluded directory may still hold what a `!` pattern brings back.
			if fi, serr := os.Stat(m); !ex || (serr == nil && fi.IsDir() && b.ignore.descend()) {
				kept = append(kept, m)
			}
		}
		if len(kept) == 0 {
			return nil, fmt.Errorf("%s: source %s: excluded from the build context by %s (remove its pattern, or add !%s after it)", loc, s, b.ignore.file, strings.TrimPrefix(path.Clean("/"+s), "/"))
		}
		files = append(files, kept...)
	}
	toDir := strings.HasSuffix(dest, "/") || len(files) > 1
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	written := map[string]bool{}
	mkParents := func(p string) error {
		dir := path.Dir(p)
		var chain []string
		for dir != "/" && dir != "." && !written[dir] {
			chain = append([]string{dir}, chain...)
			dir = path.Dir(dir)
		}
		for _, d := range chain {
			written[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
		}
		return nil
	}
	add := func(src, target string) error {
		return tartree.Write(tw, src, target, tartree.Options{
			Skip: func(p string, d fs.DirEntry) error {
				crel, _ := filepath.Rel(ctxAbs, p)
				if crel == "." {
					return nil
				}
				ex, err := b.ignore.excluded(crel)
				if err != nil {
					return fmt.Errorf("%s: %w", b.ignore.file, err)
				}
				switch {
				case ex && d.IsDir() && b.ignore.descend():
					return tartree.SkipEntry // its parents are made for what comes back inside
				case ex && d.IsDir():
					return filepath.SkipDir
				case ex:
					return tartree.SkipEntry
				}
				return nil
			},
			Header: func(h *tar.Header) error {
				t := "/" + strings.TrimSuffix(h.Name, "/")
				if err := mkParents(t); err != nil {
					return err
				}
				h.Uid, h.Gid = uid, gid
				if h.Typeflag == tar.TypeDir {
					written[t] = true
				} else if chmod != nil {
					h.Mode = int64(*chmod)
				}
				return nil
			},
		})
	}
	sort.Strings(files)
	for _, src := range files {
		fi, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		target := dest
		switch {
		case fi.IsDir():
			// A directory's contents go into dest, as docker does.
		case toDir:
			target = path.Join(dest, filepath.Base(src))
		}
		if err := add(src, path.Clean(target)); err != nil {
			return nil, fmt.Errorf("%s: %w", loc, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}
