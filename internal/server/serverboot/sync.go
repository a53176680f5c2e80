package serverboot

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

// Syncer keeps one sealed record in the datastore for every valid join
// token, and none for a token deleted or expired. Every server runs one:
// they write the same content, so which one wins a race does not matter,
// and a cluster keeps its records while any server runs.
type Syncer struct {
	Client   kubernetes.Interface
	Store    datastore.BootstrapStore
	Layout   datadir.Layout
	Settings map[string]string
	Log      *slog.Logger
	// Now is the clock of token expiry (time.Now when nil).
	Now func() time.Time
	// Every is the resync period besides token changes (default 30 s):
	// it catches expiries and records removed by hand.
	Every time.Duration

	// done maps a token id to the digest of the bundle and secret its
	// record was last checked to hold, so that an unchanged token costs
	// no key derivation.
	done map[string][32]byte
}

func (s *Syncer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Run syncs at once, on every change of a token Secret, and every Every,
// until ctx ends. A failed sync is logged and retried.
func (s *Syncer) Run(ctx context.Context) {
	every := s.Every
	if every == 0 {
		every = 30 * time.Second
	}
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	f := informers.NewSharedInformerFactoryWithOptions(s.Client, 0, informers.WithNamespace(metav1.NamespaceSystem),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "type=" + string(bootstrapapi.SecretTypeBootstrapToken)
		}))
	inf := f.Core().V1().Secrets().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke,
		UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	lister := f.Core().V1().Secrets().Lister()
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		secrets, err := lister.Secrets(metav1.NamespaceSystem).List(labels.Everything())
		if err == nil {
			err = s.Sync(ctx, secrets)
		}
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			s.Log.Warn("bootstrap records of the join tokens not synced; retrying (a server joining with a new token waits for its record)", "err", err)
			failing = true
		case err == nil && failing:
			s.Log.Info("bootstrap records of the join tokens synced again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-t.C:
		}
	}
}

// Sync makes the records match secrets, the cluster's token Secrets.
func (s *Syncer) Sync(ctx context.Context, secrets []*corev1.Secret) error {
	if s.done == nil {
		s.done = map[string][32]byte{}
	}
	base, err := Collect(s.Layout, s.Settings)
	if err != nil {
		return err
	}
	// Listed first: a record removed by hand (or by a server whose
	// informer had not yet seen a new token) is written again even though
	// done remembers writing it.
	ids, err := s.Store.List(ctx)
	if err != nil {
		return err
	}
	stored := map[string]bool{}
	for _, id := range ids {
		stored[id] = true
	}
	valid := map[string]bool{}
	for _, sec := range secrets {
		tok, exp, ok := tokenOf(sec)
		if !ok || (exp != nil && s.now().After(*exp)) {
			continue
		}
		valid[tok.ID] = true
		b := base
		b.Expires = exp
		plain, err := json.Marshal(b)
		if err != nil {
			return err
		}
		digest := sha256.Sum256(append(plain, tok.Secret...))
		if s.done[tok.ID] == digest && stored[tok.ID] {
			continue
		}
		if rec, ok, err := s.Store.Get(ctx, tok.ID); err != nil {
			return err
		} else if ok {
			if have, err := Open(rec, tok); err == nil {
				if hp, _ := json.Marshal(have); string(hp) == string(plain) {
					s.done[tok.ID] = digest
					continue
				}
			}
		}
		rec, err := Seal(b, tok)
		if err != nil {
			return err
		}
		if err := s.Store.Put(ctx, tok.ID, rec); err != nil {
			return err
		}
		s.done[tok.ID] = digest
		s.Log.Info("bootstrap record written: servers may join with the token", "token", tok.ID)
	}
	for _, id := range ids {
		if valid[id] {
			continue
		}
		if err := s.Store.Delete(ctx, id); err != nil {
			return err
		}
		delete(s.done, id)
		s.Log.Info("bootstrap record removed: its token was deleted or expired", "token", id)
	}
	return nil
}

// tokenOf reads a bootstrap-token Secret; ok is false for one that is not
// well formed (the join endpoint refuses it too).
func tokenOf(sec *corev1.Secret) (tok joinv1.Token, expires *time.Time, ok bool) {
	if sec.Type != bootstrapapi.SecretTypeBootstrapToken {
		return tok, nil, false
	}
	t, err := joinv1.ParseBearer(string(sec.Data[bootstrapapi.BootstrapTokenIDKey]) + "." + string(sec.Data[bootstrapapi.BootstrapTokenSecretKey]))
	if err != nil {
		return tok, nil, false
	}
	if v := sec.Data[bootstrapapi.BootstrapTokenExpirationKey]; len(v) > 0 {
		e, err := time.Parse(time.RFC3339, string(v))
		if err != nil {
			return tok, nil, false
		}
		expires = &e
	}
	return t, expires, true
}

// Settings are the flags every server of a cluster must give alike.
func Settings(clusterCIDR, serviceCIDR, clusterDNS, clusterDomain string) map[string]string {
	return map[string]string{"cluster-cidr": clusterCIDR, "service-cidr": serviceCIDR,
		"cluster-dns": clusterDNS, "cluster-domain": clusterDomain}
}
