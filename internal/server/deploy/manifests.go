package deploy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Defaults of the folder's loop.
const (
	DefaultPoll   = 2 * time.Second
	DefaultResync = time.Minute
)

// Folder applies every *.yaml, *.yml and *.json under Dir: at start, when
// a file changes (the folder is polled, which needs no inotify and works the
// same on darwin), and every Resync, which brings back objects users
// deleted. <file>.skip disables a file. Removing a file keeps its objects
// (nothing tracks what a file made); delete them with kubectl.
type Folder struct {
	Dir     string
	Applier *Applier
	Events  kubernetes.Interface // optional: failures become Events in kube-system
	Log     *slog.Logger
	Poll    time.Duration
	Resync  time.Duration

	files map[string]fileState
}

type fileState struct {
	sum     [sha256.Size]byte
	invalid bool // does not parse: retrying it unchanged cannot help
}

// Run applies the folder until ctx ends.
func (f *Folder) Run(ctx context.Context) {
	if f.Poll <= 0 {
		f.Poll = DefaultPoll
	}
	if f.Resync <= 0 {
		f.Resync = DefaultResync
	}
	last := time.Now()
	f.Sync(ctx, true)
	t := time.NewTicker(f.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		force := time.Since(last) >= f.Resync
		if force {
			last = time.Now()
		}
		f.Sync(ctx, force)
	}
}

// Manifests lists the files of dir that are applied, and those a .skip
// file disables.
func Manifests(dir string) (apply, skipped []string, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() && p != dir && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir
			}
			return nil
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
		default:
			return nil
		}
		if _, err := os.Stat(p + ".skip"); err == nil {
			skipped = append(skipped, p)
			return nil
		}
		apply = append(apply, p)
		return nil
	})
	sort.Strings(apply)
	return apply, skipped, err
}

// Sync applies the files that changed, failed before, or all with force.
func (f *Folder) Sync(ctx context.Context, force bool) {
	if f.files == nil {
		f.files = map[string]fileState{}
	}
	paths, skipped, err := Manifests(f.Dir)
	if err != nil {
		f.Log.Warn("cannot read the manifests folder", "dir", f.Dir, "err", err)
		return
	}
	seen := map[string]bool{}
	for _, p := range paths {
		seen[p] = true
		data, err := os.ReadFile(p)
		if err != nil {
			f.Log.Warn("cannot read manifest", "file", p, "err", err)
			continue
		}
		sum := sha256.Sum256(data)
		old, known := f.files[p]
		// A file that failed to apply is retried on resync or when it
		// changes (an apiserver refusal would otherwise repeat every poll);
		// one that does not parse, only when it changes.
		if known && old.sum == sum && (!force || old.invalid) {
			continue
		}
		f.files[p] = fileState{sum: sum, invalid: !f.applyFile(ctx, p, data)}
	}
	for _, p := range skipped {
		if _, known := f.files[p]; known {
			f.Log.Info("manifest skipped (.skip file); its objects are kept", "file", p)
			delete(f.files, p)
		}
	}
	for p := range f.files {
		if !seen[p] {
			f.Log.Info("manifest removed; its objects are kept (delete them with kubectl)", "file", p)
			delete(f.files, p)
		}
	}
}

// applyFile reports false when the file does not parse.
func (f *Folder) applyFile(ctx context.Context, path string, data []byte) bool {
	rel, _ := filepath.Rel(f.Dir, path)
	objs, err := Parse(data)
	if err != nil {
		msg := fmt.Sprintf("manifest %s not applied: %v", rel, err)
		f.Log.Warn(msg, "file", path)
		f.event(ctx, "ManifestInvalid", msg)
		return false
	}
	if err := f.Applier.ApplyAll(ctx, objs); err != nil {
		msg := fmt.Sprintf("manifest %s: %v", rel, err)
		f.Log.Warn(msg, "file", path)
		f.event(ctx, "ManifestApplyFailed", msg)
		return true
	}
	f.Log.Debug("manifest applied", "file", path, "objects", len(objs))
	return true
}

// event records a failure where `kubectl get events -n kube-system` shows
// it; the log line is the record if the apiserver refuses it.
func (f *Folder) event(ctx context.Context, reason, msg string) {
	if f.Events == nil {
		return
	}
	now := metav1.NewTime(time.Now())
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "k3sm-deploy.", Namespace: metav1.NamespaceSystem},
		// The apiserver wants the involved object's namespace to be the event's.
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: metav1.NamespaceSystem, Namespace: metav1.NamespaceSystem},
		Reason:         reason,
		Message:        msg,
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: FieldManager},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := f.Events.CoreV1().Events(metav1.NamespaceSystem).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		f.Log.Warn("cannot record the failure as an Event", "err", err)
	}
}
