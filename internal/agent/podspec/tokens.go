package podspec

import (
	"context"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// token returns a service-account token for a projected volume, bound to the
// pod, from the cache while it is fresh: like the kubelet's token manager it
// requests a new one once 80% of its lifetime (or 24 h) has passed.
func (t *Translator) token(ctx context.Context, pod *corev1.Pod, volume string, s *corev1.ServiceAccountTokenProjection) (string, error) {
	exp := int64(3600)
	if s.ExpirationSeconds != nil {
		exp = *s.ExpirationSeconds
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	k := tokenKey{pod: pod.UID, sa: sa, audience: s.Audience, seconds: exp}
	now := t.clock()
	if tok, ok := t.tokens.get(k, now); ok {
		return tok, nil
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if s.Audience != "" {
		req.Spec.Audiences = []string{s.Audience}
	}
	res, err := t.src.Token(ctx, pod.Namespace, sa, req)
	if err != nil {
		return "", fmt.Errorf("token for service account %q: %w", sa, err)
	}
	expires := res.Status.ExpirationTimestamp.Time
	// The apiserver may extend a token's validity; refresh on the lifetime
	// asked for, so a rotated key or revoked binding is picked up.
	if asked := now.Add(time.Duration(exp) * time.Second); expires.IsZero() || expires.After(asked) {
		expires = asked
	}
	t.tokens.put(k, cachedToken{token: res.Status.Token, issued: now, expires: expires})
	return res.Status.Token, nil
}

func (t *Translator) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

type tokenKey struct {
	pod      types.UID
	sa       string
	audience string
	seconds  int64
}

type cachedToken struct {
	token           string
	issued, expires time.Time
}

// tokenCache holds the projected tokens of the node's pods.
type tokenCache struct {
	mu sync.Mutex
	m  map[tokenKey]cachedToken
}

func (c *tokenCache) get(k tokenKey, now time.Time) (string, bool) {
	if c == nil {
		return "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok {
		return "", false
	}
	life := e.expires.Sub(e.issued)
	if now.After(e.issued.Add(life*8/10)) || now.Sub(e.issued) > 24*time.Hour {
		return "", false
	}
	return e.token, true
}

func (c *tokenCache) put(k tokenKey, e cachedToken) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[tokenKey]cachedToken{}
	}
	c.m[k] = e
}

// forget drops a deleted pod's tokens.
func (c *tokenCache) forget(uid types.UID) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if k.pod == uid {
			delete(c.m, k)
		}
	}
}
