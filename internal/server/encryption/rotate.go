package encryption

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/kinedb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ReloadTimeout bounds the wait for the apiserver to load a new
// configuration (it re-reads the file every minute).
var ReloadTimeout = 3 * time.Minute

// Rotator rotates the key of a running cluster.
type Rotator struct {
	DataDir string
	Client  kubernetes.Interface
	// Progress receives one line per step.
	Progress func(string)
	Now      func() time.Time
}

// RotateResult says what a rotation did.
type RotateResult struct {
	NewKey    string   `json:"newKey"`
	Dropped   []string `json:"droppedKeys"`
	Rewritten int      `json:"rewrittenSecrets"`
}

func (r *Rotator) say(format string, args ...any) {
	if r.Progress != nil {
		r.Progress(fmt.Sprintf(format, args...))
	}
}

// Rotate adds a new key as the encrypting one (keeping the old ones for
// reading), waits until the apiserver has loaded it, rewrites every Secret
// so it is stored with the new key, checks in the datastore that none is
// left under an old key, then drops the old keys. Each step keeps every
// Secret readable, so the cluster serves throughout; a rotation cut short
// is finished by running it again.
func (r *Rotator) Rotate(ctx context.Context) (RotateResult, error) {
	var res RotateResult
	l := datadir.New(r.DataDir)
	path := l.EncryptionConfig()
	old, err := Read(path)
	if err != nil {
		return res, err
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	key, err := NewKey(now())
	if err != nil {
		return res, err
	}
	for _, k := range old {
		if k.Name == key.Name {
			return res, fmt.Errorf("key %s exists already: wait a second and run rotate-keys again", key.Name)
		}
	}
	res.NewKey = key.Name
	data, err := Write(path, append([]Key{key}, old...))
	if err != nil {
		return res, err
	}
	r.say("added key %s (encrypting), kept %s (decrypting); waiting for the apiserver to load it (it re-reads %s every minute)", key.Name, names(old), path)
	if err := r.waitLoaded(ctx, data); err != nil {
		return res, err
	}
	r.say("the apiserver encrypts with %s now; rewriting every Secret", key.Name)
	for pass := 0; ; pass++ {
		n, err := r.rewrite(ctx)
		res.Rewritten += n
		if err != nil {
			return res, err
		}
		stale, err := r.stale(ctx, l, key.Name)
		if err != nil {
			return res, err
		}
		if len(stale) == 0 {
			break
		}
		if pass >= 4 {
			return res, fmt.Errorf("%d Secrets are still stored with an old key after %d passes (e.g. %s); the old keys are kept, run rotate-keys again",
				len(stale), pass+1, stale[0])
		}
	}
	r.say("rewrote %d Secrets; every Secret in the datastore is encrypted with %s; dropping %s", res.Rewritten, key.Name, names(old))
	data, err = Write(path, []Key{key})
	if err != nil {
		return res, err
	}
	if err := r.waitLoaded(ctx, data); err != nil {
		return res, err
	}
	for _, k := range old {
		res.Dropped = append(res.Dropped, k.Name)
	}
	r.say("done: key %s, old keys dropped", key.Name)
	return res, nil
}

func names(keys []Key) string {
	var s []string
	for _, k := range keys {
		s = append(s, k.Name)
	}
	return strings.Join(s, ", ")
}

// waitLoaded waits until the apiserver reports the configuration data as
// its loaded one (the hash label of apiserver_encryption_config_controller_last_config_info).
func (r *Rotator) waitLoaded(ctx context.Context, data []byte) error {
	want := `hash="` + ConfigHash(data) + `"`
	ctx, cancel := context.WithTimeout(ctx, ReloadTimeout)
	defer cancel()
	var lastErr error
	for {
		raw, err := r.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(raw))
			sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
			for sc.Scan() {
				line := sc.Text()
				if strings.HasPrefix(line, "apiserver_encryption_config_controller_last_config_info{") && strings.Contains(line, want) {
					return nil
				}
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("the apiserver has not loaded the new encryption configuration after %s (see logs/kube-apiserver.log)", ReloadTimeout)
			if lastErr != nil {
				msg += ": " + lastErr.Error()
			}
			return errors.New(msg + "; the configuration keeps every key still needed, so no Secret is lost: run rotate-keys again")
		case <-time.After(2 * time.Second):
		}
	}
}

// rewrite updates every Secret unchanged: the apiserver sees it was read
// with a key that is no longer the encrypting one and stores it again.
func (r *Rotator) rewrite(ctx context.Context) (int, error) {
	n := 0
	secrets := r.Client.CoreV1().Secrets(metav1.NamespaceAll)
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := secrets.List(ctx, opts)
		if err != nil {
			return n, fmt.Errorf("list Secrets: %w", err)
		}
		for i := range list.Items {
			if err := r.touch(ctx, &list.Items[i]); err != nil {
				return n, err
			}
			n++
		}
		if list.Continue == "" {
			return n, nil
		}
		opts.Continue = list.Continue
	}
}

func (r *Rotator) touch(ctx context.Context, s *corev1.Secret) error {
	c := r.Client.CoreV1().Secrets(s.Namespace)
	for range 5 {
		_, err := c.Update(ctx, s, metav1.UpdateOptions{})
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			// Changed meanwhile: that write used the new key already, but read it again to be sure.
			fresh, gerr := c.Get(ctx, s.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) {
				return nil
			} else if gerr != nil {
				return gerr
			}
			s = fresh
		default:
			return fmt.Errorf("rewrite Secret %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return fmt.Errorf("rewrite Secret %s/%s: it keeps changing", s.Namespace, s.Name)
}

// stale lists the Secrets the datastore holds under another key than name.
func (r *Rotator) stale(ctx context.Context, l datadir.Layout, name string) ([]string, error) {
	db, err := kinedb.Open(l.DBFile())
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var out []string
	err = db.Latest(ctx, SecretsKeyPrefix, func(k string, v []byte) error {
		if KeyOf(v) != name {
			out = append(out, strings.TrimPrefix(k, SecretsKeyPrefix))
		}
		return nil
	})
	return out, err
}
