// Package join is the server side of a node joining the cluster: join
// tokens kept as upstream bootstrap-token Secrets (`k3sm token`), and the
// supervisor endpoint under /v1-k3sm/ that serves the cluster CA, checks a
// token and the node's password, signs the node's certificates from its
// CSRs and hands it the cluster's settings. The node's side is
// internal/agent/join; the contract between them is api/join/v1.
package join

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// Namespace holds the tokens and the node passwords, as upstream's and k3s's.
const Namespace = metav1.NamespaceSystem

// TokenInfo is one token as `k3sm token list` shows it; never its secret.
type TokenInfo struct {
	ID          string
	Description string
	// Expires is zero for a token that does not expire.
	Expires time.Time
	Created time.Time
}

// CreateToken stores a new bootstrap token (ttl 0: it never expires) and
// returns it as a join token pinned to caPEM.
func CreateToken(ctx context.Context, cs kubernetes.Interface, caPEM []byte, ttl time.Duration, description string, now time.Time) (joinv1.Token, error) {
	if ttl < 0 {
		return joinv1.Token{}, errors.New("--ttl: negative; use 0 for a token that never expires, or e.g. 24h")
	}
	raw, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return joinv1.Token{}, err
	}
	tok, err := joinv1.ParseBearer(raw)
	if err != nil {
		return joinv1.Token{}, err
	}
	tok.CAHash = joinv1.CAHash(caPEM)
	data := map[string][]byte{
		bootstrapapi.BootstrapTokenIDKey:     []byte(tok.ID),
		bootstrapapi.BootstrapTokenSecretKey: []byte(tok.Secret),
		// k3sm's join authenticates with it; the apiserver does not
		// (no --enable-bootstrap-token-auth), so no usage is set.
	}
	if description != "" {
		data[bootstrapapi.BootstrapTokenDescriptionKey] = []byte(description)
	}
	if ttl > 0 {
		data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(now.Add(ttl).UTC().Format(time.RFC3339))
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstraputil.BootstrapTokenSecretName(tok.ID), Namespace: Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "k3sm"}},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		Data: data,
	}
	if _, err := cs.CoreV1().Secrets(Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return joinv1.Token{}, fmt.Errorf("store the token: %w", err)
	}
	return tok, nil
}

// ListTokens returns every bootstrap token of the cluster, by creation.
func ListTokens(ctx context.Context, cs kubernetes.Interface) ([]TokenInfo, error) {
	list, err := cs.CoreV1().Secrets(Namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=" + string(bootstrapapi.SecretTypeBootstrapToken)})
	if err != nil {
		return nil, err
	}
	var out []TokenInfo
	for _, s := range list.Items {
		id := string(s.Data[bootstrapapi.BootstrapTokenIDKey])
		if s.Name != bootstraputil.BootstrapTokenSecretName(id) {
			continue
		}
		ti := TokenInfo{ID: id, Description: string(s.Data[bootstrapapi.BootstrapTokenDescriptionKey]), Created: s.CreationTimestamp.Time}
		ti.Expires, _ = expiration(&s)
		out = append(out, ti)
	}
	slices.SortFunc(out, func(a, b TokenInfo) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// DeleteToken removes the token whose id (or whole join or bootstrap
// token) is given.
func DeleteToken(ctx context.Context, cs kubernetes.Interface, idOrToken string) error {
	id := idOrToken
	if t, err := joinv1.ParseToken(idOrToken); err == nil {
		id = t.ID
	} else if t, err := joinv1.ParseBearer(idOrToken); err == nil {
		id = t.ID
	}
	if !bootstraputil.IsValidBootstrapTokenID(id) {
		return fmt.Errorf("%q is not a token id (6 characters of [a-z0-9], as `k3sm token list` shows)", idOrToken)
	}
	err := cs.CoreV1().Secrets(Namespace).Delete(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("no token %s: `k3sm token list` shows the tokens", id)
	}
	return err
}

// errBadToken is every reason a token is refused: the node is not told
// which, so a guess learns nothing.
var errBadToken = &joinv1.Error{Message: "the join token is not valid: it is unknown, deleted or expired",
	Fix: "create a new one on the server with `k3sm token create` and pass it as --token"}

// checkToken accepts bearer if its Secret exists, holds the same secret and
// has not expired.
func checkToken(ctx context.Context, cs kubernetes.Interface, bearer string, now time.Time) error {
	tok, err := joinv1.ParseBearer(bearer)
	if err != nil {
		return errBadToken
	}
	s, err := cs.CoreV1().Secrets(Namespace).Get(ctx, bootstraputil.BootstrapTokenSecretName(tok.ID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return errBadToken
	} else if err != nil {
		return fmt.Errorf("read the token: %w", err)
	}
	if s.Type != bootstrapapi.SecretTypeBootstrapToken || s.DeletionTimestamp != nil ||
		subtle.ConstantTimeCompare(s.Data[bootstrapapi.BootstrapTokenSecretKey], []byte(tok.Secret)) != 1 ||
		string(s.Data[bootstrapapi.BootstrapTokenIDKey]) != tok.ID {
		return errBadToken
	}
	exp, err := expiration(s)
	if err != nil || (!exp.IsZero() && !now.Before(exp)) {
		return errBadToken
	}
	return nil
}

// expiration is the token's expiry (zero: none); a malformed one is an
// error, so the token is refused rather than taken as never expiring.
func expiration(s *corev1.Secret) (time.Time, error) {
	v := strings.TrimSpace(string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]))
	if v == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339, v)
}
