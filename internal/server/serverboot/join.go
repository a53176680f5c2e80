package serverboot

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

// FlagToken is the server's flag of the join token.
const FlagToken = "token"

// Join fills the new data directory l from tok's record in store: the
// record must exist (retried for wait: the cluster's servers write it
// within a second of `k3sm token create`), open with tok's secret, hold
// the CA tok pins, not be expired, and agree with mine, the joining
// server's settings. Nothing is written unless every check passes.
func Join(ctx context.Context, store datastore.BootstrapStore, tok joinv1.Token, l datadir.Layout, mine map[string]string, now time.Time, wait time.Duration, progress func(error)) error {
	deadline := time.Now().Add(wait)
	var rec []byte
	for {
		v, ok, err := store.Get(ctx, tok.ID)
		if ok {
			rec = v
			break
		}
		if err == nil {
			err = fmt.Errorf("no bootstrap record of token %s yet", tok.ID)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return &datastore.FieldError{Flag: FlagToken, Value: redacted(tok),
				Problem: "no server of the cluster in this datastore knows the token (" + err.Error() + ")",
				Fix:     "the token is of another cluster, or was deleted or has expired: run `k3sm token create` on a server of the cluster whose --datastore-endpoint this is; nothing was started"}
		}
		if progress != nil {
			progress(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	b, err := Open(rec, tok)
	if err != nil {
		return &datastore.FieldError{Flag: FlagToken, Value: redacted(tok), Problem: err.Error(),
			Fix: "copy the whole token `k3sm token create` printed on a server of this cluster; nothing was started"}
	}
	return install(b, tok, l, mine, now)
}

// install checks an opened bundle against the token and the joining
// server's settings, then writes it into l.
func install(b Bundle, tok joinv1.Token, l datadir.Layout, mine map[string]string, now time.Time) error {
	ca := b.Files[filepath.ToSlash(mustRel(l, l.TLS("server-ca.crt")))]
	if !tok.MatchesCA(ca) {
		return &datastore.FieldError{Flag: FlagToken, Value: redacted(tok),
			Problem: "the cluster in this datastore has another CA than the one the token pins",
			Fix:     "use a token of this datastore's cluster, or the --datastore-endpoint of the token's cluster; nothing was started"}
	}
	if b.Expires != nil && now.After(*b.Expires) {
		return &datastore.FieldError{Flag: FlagToken, Value: redacted(tok), Problem: "the token expired at " + b.Expires.UTC().Format(time.RFC3339),
			Fix: "run `k3sm token create` on a server of the cluster; nothing was started"}
	}
	if err := CheckSettings(b, mine); err != nil {
		return err
	}
	if mine[FlagSecretsEncryption] == "true" && !b.Encrypted(l) {
		return &datastore.FieldError{Flag: FlagSecretsEncryption, Value: "true", Problem: "the cluster was created without it",
			Fix: "drop --secrets-encryption: every server must encrypt Secrets with the cluster's keys, and it has none; nothing was started"}
	}
	return b.Install(l)
}

// FlagSecretsEncryption is the server's flag that only a cluster's first
// server decides (the others take its keys, or none).
const FlagSecretsEncryption = "secrets-encryption"

func mustRel(l datadir.Layout, p string) string {
	r, err := filepath.Rel(l.Root, p)
	if err != nil {
		panic(err)
	}
	return r
}

// redacted shows a token without its secret.
func redacted(tok joinv1.Token) string {
	return joinv1.TokenPrefix + tok.CAHash[:min(12, len(tok.CAHash))] + "...::" + tok.ID + ".xxxxx"
}
