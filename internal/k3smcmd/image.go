package k3smcmd

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
	"github.com/k3sm-dev/k3sm/internal/runtime/daemon"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
	"github.com/k3sm-dev/k3sm/internal/tartree"
	"github.com/k3sm-dev/k3sm/internal/units"
)

// imageConn reaches the data dir's image store: the running runtime
// daemon's socket (the store keeps one writer), or, with the server
// stopped, the store opened here under the daemon's lock.
type imageConn struct {
	runtimev1.ImagesClient
	close func()
}

func dialImages(dataDir string) (*imageConn, error) {
	if fi, err := os.Stat(dataDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("no k3sm cluster at %s (the data dir does not exist): start one with `k3sm server`, or pass --data-dir (or $K3SM_DATA_DIR) of an existing one", dataDir)
	}
	dirs := datadir.New(dataDir)
	sock, stop, err := daemon.ServeImagesOffline(dataDir, dirs.RegistriesFile())
	if errors.Is(err, daemon.ErrDaemonRunning) {
		sock, stop = dirs.RuntimeSocket(), func() {}
	} else if err != nil {
		return nil, fmt.Errorf("open the image store of %s: %w", dataDir, err)
	}
	c, err := client.Dial(sock)
	if err != nil {
		stop()
		return nil, err
	}
	return &imageConn{ImagesClient: c.Images, close: func() { c.Close(); stop() }}, nil
}

// grpcErr strips the gRPC wrapping from the daemon's message.
func grpcErr(err error) error {
	if s, ok := status.FromError(err); ok {
		return errors.New(s.Message())
	}
	return err
}

func newImage() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Manage the node's image store: load, import, build, pull, push, tag, save, prune",
		Long: "Works on the image store of the data dir's runtime: through the running server's runtime daemon, or,\n" +
			"with the server stopped, on the store directly (locked, so a server that starts meanwhile waits).\n" +
			"Pulls and pushes use <data-dir>/registries.yaml (mirrors, credentials, TLS) as pods' pulls do.",
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", controlplane.DefaultDataDir(), "the server's data directory ($K3SM_DATA_DIR)")
	with := func(run func(cmd *cobra.Command, args []string, c *imageConn) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			c, err := dialImages(dataDir)
			if err != nil {
				return err
			}
			defer c.close()
			return run(cmd, args, c)
		}
	}
	cmd.AddCommand(imageLs(with), imageDf(with), imagePull(with), imagePush(with), imageTag(with), imageUntag(with),
		imageInspect(with), imageSave(with), imageLoad(with, "load"), imageLoad(with, "import"), imagePrune(with), imageBuild(with))
	return cmd
}

type runner func(run func(cmd *cobra.Command, args []string, c *imageConn) error) func(*cobra.Command, []string) error

// imageRow is one image as ls -o json prints it.
type imageRow struct {
	ID          string   `json:"id"`
	RepoTags    []string `json:"repoTags"`
	RepoDigests []string `json:"repoDigests"`
	Size        int64    `json:"size"`
	Platform    string   `json:"platform"`
	UsedBy      []string `json:"usedBy"`
}

func rowOf(i *runtimev1.Image) imageRow {
	return imageRow{ID: i.GetId(), RepoTags: nonNil(i.GetRepoTags()), RepoDigests: nonNil(i.GetRepoDigests()), Size: i.GetSizeBytes(),
		Platform: i.GetOs() + "/" + i.GetArch(), UsedBy: nonNil(i.GetUsedBy())}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func shortID(id string) string {
	h := strings.TrimPrefix(id, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

func imageLs(with runner) *cobra.Command {
	var output string
	var quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the stored images (one line per tag)",
		Args:    cobra.NoArgs,
		RunE: with(func(cmd *cobra.Command, _ []string, c *imageConn) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			resp, err := c.ListImages(cmd.Context(), &runtimev1.ListImagesRequest{})
			if err != nil {
				return grpcErr(err)
			}
			rows := []imageRow{}
			for _, i := range resp.GetImages() {
				rows = append(rows, rowOf(i))
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), rows)
			}
			if quiet {
				for _, r := range rows {
					fmt.Fprintln(cmd.OutOrStdout(), r.ID)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "IMAGE\tTAG\tIMAGE ID\tSIZE\tPLATFORM\tUSED BY")
			for _, r := range rows {
				used := strings.Join(r.UsedBy, ",")
				if used == "" {
					used = "-"
				}
				tags := r.RepoTags
				if len(tags) == 0 {
					tags = []string{"<none>:<none>"}
				}
				for _, t := range tags {
					repo, tag := splitTag(t)
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", repo, tag, shortID(r.ID), units.Bytes(r.Size), r.Platform, used)
				}
			}
			return tw.Flush()
		}),
	}
	outputFlag(cmd, &output)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only image ids")
	return cmd
}

func splitTag(t string) (string, string) {
	i := strings.LastIndex(t, ":")
	if i < 0 || strings.Contains(t[i:], "/") {
		return t, "<none>"
	}
	return t[:i], t[i+1:]
}

type dfReport struct {
	Images      int    `json:"images"`
	InUse       int    `json:"inUse"`
	UsedBytes   uint64 `json:"usedBytes"`
	Reclaimable uint64 `json:"reclaimableBytes"`
	Capacity    uint64 `json:"capacityBytes"`
	Available   uint64 `json:"availableBytes"`
	Path        string `json:"path"`
}

func imageDf(with runner) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "df",
		Short: "Show the image store's disk usage and what `k3sm image prune` would free",
		Args:  cobra.NoArgs,
		RunE: with(func(cmd *cobra.Command, _ []string, c *imageConn) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ctx := cmd.Context()
			fsi, err := c.ImageFsInfo(ctx, &runtimev1.ImageFsInfoRequest{})
			if err != nil {
				return grpcErr(err)
			}
			list, err := c.ListImages(ctx, &runtimev1.ListImagesRequest{})
			if err != nil {
				return grpcErr(err)
			}
			dry, err := c.PruneImages(ctx, &runtimev1.PruneImagesRequest{DryRun: true})
			if err != nil {
				return grpcErr(err)
			}
			r := dfReport{Images: len(list.GetImages()), UsedBytes: fsi.GetUsedBytes(), Reclaimable: dry.GetFreedBytes(),
				Capacity: fsi.GetCapacityBytes(), Available: fsi.GetAvailableBytes(), Path: fsi.GetMountpoint()}
			for _, i := range list.GetImages() {
				if len(i.GetUsedBy()) > 0 {
					r.InUse++
				}
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "IMAGES\tIN USE\tSTORE SIZE\tRECLAIMABLE\tFS AVAILABLE\tPATH")
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s of %s\t%s\n", r.Images, r.InUse, units.Bytes(int64(r.UsedBytes)), units.Bytes(int64(r.Reclaimable)),
				units.Bytes(int64(r.Available)), units.Bytes(int64(r.Capacity)), r.Path)
			return tw.Flush()
		}),
	}
	outputFlag(cmd, &output)
	return cmd
}

// progressBar shows bytes/total on stderr: a redrawn bar on a terminal,
// otherwise a plain line at most every 2 s (and at the end).
type progressBar struct {
	w     io.Writer
	tty   bool
	label string
	mu    sync.Mutex
	last  time.Time
	shown bool
}

func newProgressBar(w io.Writer, label string) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &progressBar{w: w, tty: tty, label: label}
}

func (p *progressBar) update(done, total int64, final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	every := 2 * time.Second
	if p.tty {
		every = 100 * time.Millisecond
	}
	if !final && p.shown && now.Sub(p.last) < every {
		return
	}
	p.last, p.shown = now, true
	amount := units.Bytes(done)
	pct := ""
	if total > 0 {
		amount += " / " + units.Bytes(total)
		pct = fmt.Sprintf(" %3d%%", done*100/total)
	}
	if !p.tty {
		fmt.Fprintf(p.w, "%s: %s%s\n", p.label, amount, pct)
		return
	}
	bar := ""
	if total > 0 {
		const width = 30
		n := int(done * width / total)
		bar = "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "] "
	}
	fmt.Fprintf(p.w, "\r\033[K%s %s%s%s", p.label, bar, amount, pct)
	if final {
		fmt.Fprintln(p.w)
	}
}

// followProgress prints a pull's or push's stream and returns its image.
func followProgress(recv func() (*runtimev1.ImageProgress, error), bar *progressBar) (*runtimev1.Image, error) {
	var done, total int64
	for {
		m, err := recv()
		if err == io.EOF {
			return nil, errors.New("the runtime ended the transfer without a result")
		}
		if err != nil {
			return nil, grpcErr(err)
		}
		if m.GetImage() != nil {
			bar.update(done, total, true)
			return m.GetImage(), nil
		}
		done, total = m.GetDoneBytes(), m.GetTotalBytes()
		bar.update(done, total, false)
	}
}

func imagePull(with runner) *cobra.Command {
	return &cobra.Command{
		Use:   "pull IMAGE...",
		Short: "Pull images into the store (registries.yaml mirrors and credentials apply), with progress on stderr",
		Args:  cobra.MinimumNArgs(1),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			for _, ref := range args {
				stream, err := c.PullImageProgress(cmd.Context(), &runtimev1.PullImageRequest{Image: ref})
				if err != nil {
					return grpcErr(err)
				}
				img, err := followProgress(stream.Recv, newProgressBar(cmd.ErrOrStderr(), "pull "+ref))
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", ref, img.GetId())
			}
			return nil
		}),
	}
}

func imagePush(with runner) *cobra.Command {
	return &cobra.Command{
		Use:   "push IMAGE [TARGET]",
		Short: "Push a stored image to a registry (to TARGET if given), with progress on stderr",
		Long:  "Credentials and TLS settings for the registry come from <data-dir>/registries.yaml (configs.<host>).",
		Args:  cobra.RangeArgs(1, 2),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			target := args[0]
			if len(args) == 2 {
				target = args[1]
			}
			stream, err := c.PushImage(cmd.Context(), &runtimev1.PushImageRequest{Image: args[0], Target: target})
			if err != nil {
				return grpcErr(err)
			}
			img, err := followProgress(stream.Recv, newProgressBar(cmd.ErrOrStderr(), "push "+target))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", target, img.GetId())
			return nil
		}),
	}
}

func imageTag(with runner) *cobra.Command {
	return &cobra.Command{
		Use:   "tag SOURCE TARGET",
		Short: "Give a stored image (by name or id) another name",
		Args:  cobra.ExactArgs(2),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			if _, err := c.TagImage(cmd.Context(), &runtimev1.TagImageRequest{Source: args[0], Target: args[1]}); err != nil {
				return grpcErr(err)
			}
			return nil
		}),
	}
}

func imageUntag(with runner) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "untag IMAGE...",
		Aliases: []string{"rm", "rmi"},
		Short:   "Remove names; an image left without one (or named by id) is deleted unless a pod uses it",
		Args:    cobra.MinimumNArgs(1),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			for _, ref := range args {
				resp, err := c.UntagImage(cmd.Context(), &runtimev1.UntagImageRequest{Image: ref, Force: force})
				if err != nil {
					return grpcErr(err)
				}
				if resp.GetDeleted() {
					fmt.Fprintf(cmd.OutOrStdout(), "Deleted: %s\n", ref)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "Untagged: %s\n", ref)
				}
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "delete an image even when a pod uses it")
	return cmd
}

func imageInspect(with runner) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect IMAGE",
		Short: "Print a stored image's record, manifest and config as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			resp, err := c.InspectImage(cmd.Context(), &runtimev1.InspectImageRequest{Image: args[0]})
			if err != nil {
				return grpcErr(err)
			}
			return writeJSON(cmd.OutOrStdout(), map[string]any{"image": rowOf(resp.GetImage()),
				"manifest": json.RawMessage(resp.GetManifest()), "config": json.RawMessage(resp.GetConfig())})
		}),
	}
}

func imageSave(with runner) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "save IMAGE... [-o FILE]",
		Short: "Write stored images as one docker-archive tarball (`docker load` reads it)",
		Args:  cobra.MinimumNArgs(1),
		RunE: with(func(cmd *cobra.Command, args []string, c *imageConn) error {
			var w io.Writer = cmd.OutOrStdout()
			if out == "" {
				if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					return errors.New("refusing to write a tarball to a terminal: pass -o FILE or redirect stdout")
				}
			}
			stream, err := c.SaveImage(cmd.Context(), &runtimev1.SaveImageRequest{Images: args})
			if err != nil {
				return grpcErr(err)
			}
			var f *os.File
			if out != "" {
				if f, err = os.CreateTemp(filepath.Dir(out), ".k3sm-save-*"); err != nil {
					return fmt.Errorf("-o %s: %w", out, err)
				}
				defer os.Remove(f.Name())
				w = f
			}
			for {
				m, err := stream.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					if f != nil {
						f.Close()
					}
					return grpcErr(err)
				}
				if _, err := w.Write(m.GetChunk()); err != nil {
					return err
				}
			}
			if f != nil {
				if err := f.Close(); err != nil {
					return err
				}
				return os.Rename(f.Name(), out)
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of stdout")
	return cmd
}

// imageLoad is `load` (a docker-archive from -i FILE or stdin) and `import`
// (an OCI image layout directory, or any tarball load takes).
func imageLoad(with runner, verb string) *cobra.Command {
	var input string
	var tags []string
	cmd := &cobra.Command{
		Use:   "load [-i FILE]",
		Short: "Store the images of a docker-archive tarball (`docker save`) from FILE or stdin",
		Args:  cobra.NoArgs,
	}
	if verb == "import" {
		cmd.Use = "import PATH"
		cmd.Short = "Store the images of an OCI image layout (a directory or its tarball) or a docker-archive"
		cmd.Args = cobra.ExactArgs(1)
	}
	cmd.RunE = with(func(cmd *cobra.Command, args []string, c *imageConn) error {
		var r io.Reader = cmd.InOrStdin()
		src := "stdin"
		if verb == "import" {
			input = args[0]
		}
		if input != "" {
			src = input
			fi, err := os.Stat(input)
			if err != nil {
				return err
			}
			if fi.IsDir() {
				if _, err := os.Stat(filepath.Join(input, "oci-layout")); err != nil {
					return fmt.Errorf("%s is a directory without an oci-layout file: import takes an OCI image layout (e.g. `crane push --format=oci`, `skopeo copy oci:DIR`) or a tarball", input)
				}
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(tarDir(input, pw)) }()
				r = pr
			} else {
				f, err := os.Open(input)
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
		} else if f, ok := r.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			return errors.New("no archive: pass -i FILE or pipe a tarball to stdin (`docker save IMAGE | k3sm image load`)")
		}
		stream, err := c.LoadImage(cmd.Context())
		if err != nil {
			return grpcErr(err)
		}
		if err := stream.Send(&runtimev1.LoadImageRequest{Tags: tags}); err != nil {
			return grpcErr(err)
		}
		bar := newProgressBar(cmd.ErrOrStderr(), verb+" "+src)
		buf := make([]byte, 1<<20)
		var sent int64
		for {
			n, rerr := r.Read(buf)
			if n > 0 {
				if err := stream.Send(&runtimev1.LoadImageRequest{Chunk: buf[:n]}); err != nil {
					break // the daemon's error comes with CloseAndRecv
				}
				sent += int64(n)
				bar.update(sent, 0, false)
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				return fmt.Errorf("read %s: %w", src, rerr)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			return grpcErr(err)
		}
		for _, i := range resp.GetImages() {
			name := strings.Join(i.GetRepoTags(), ", ")
			if name == "" {
				name = "(no name)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Loaded image: %s %s\n", name, i.GetId())
		}
		return nil
	})
	if verb == "load" {
		cmd.Flags().StringVarP(&input, "input", "i", "", "read the tarball from FILE instead of stdin")
	}
	cmd.Flags().StringSliceVarP(&tags, "tag", "t", nil, "name the archive's single image (repeatable)")
	return cmd
}

// tarDir writes the tree at dir (an OCI image layout) as a tarball.
func tarDir(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	if err := tartree.Write(tw, dir, "", tartree.Options{}); err != nil {
		return err
	}
	return tw.Close()
}

func imagePrune(with runner) *cobra.Command {
	var dangling, dryRun bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Delete every image no pod uses (--dangling: only images without a name) and unreferenced blobs",
		Args:  cobra.NoArgs,
		RunE: with(func(cmd *cobra.Command, _ []string, c *imageConn) error {
			resp, err := c.PruneImages(cmd.Context(), &runtimev1.PruneImagesRequest{DanglingOnly: dangling, DryRun: dryRun})
			if err != nil {
				return grpcErr(err)
			}
			verb := "Deleted"
			if dryRun {
				verb = "Would delete"
			}
			sort.Slice(resp.Removed, func(i, j int) bool { return resp.Removed[i].GetId() < resp.Removed[j].GetId() })
			for _, i := range resp.GetRemoved() {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s %s\n", verb, shortID(i.GetId()), strings.Join(i.GetRepoTags(), ", "))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Total reclaimed space: %s\n", units.Bytes(int64(resp.GetFreedBytes())))
			return nil
		}),
	}
	cmd.Flags().BoolVar(&dangling, "dangling", false, "only delete images without a name")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be deleted, delete nothing")
	return cmd
}
