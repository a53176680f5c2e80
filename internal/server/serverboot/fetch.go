package serverboot

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
)

// FlagServer is the flag naming the server a server joins through.
const FlagServer = "server"

// Fetch asks the server at url (its join endpoint) for the bootstrap
// record sealed for tok, as a server joining a cluster with embedded etcd
// does: the CA is fetched unverified and must be the one tok pins before
// the token is sent, as an agent's join does.
func Fetch(ctx context.Context, url string, tok joinv1.Token) (*joinv1.ServerBootstrapResponse, error) {
	const timeout = 30 * time.Second
	insecure := &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // checked against the token's hash
	ca, err := get(ctx, insecure, http.MethodGet, url+joinv1.PathCACerts, "")
	if err != nil {
		return nil, &datastore.FieldError{Flag: FlagServer, Value: url, Problem: "its join endpoint does not answer: " + err.Error(),
			Fix: "give a running server's https://HOST:PORT (its --supervisor-port, 9345 by default); nothing was started"}
	}
	if !tok.MatchesCA(ca) {
		return nil, &datastore.FieldError{Flag: FlagToken, Value: redacted(tok), Problem: "the server at " + url + " has another CA than the one the token pins",
			Fix: "use a token of that server's cluster; nothing was sent and nothing was started"}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("the server's CA is not PEM")
	}
	pinned := &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	body, err := get(ctx, pinned, http.MethodPost, url+joinv1.PathServerBootstrap, tok.Bearer())
	if err != nil {
		return nil, &datastore.FieldError{Flag: FlagToken, Value: redacted(tok), Problem: "the server refused it: " + err.Error(),
			Fix: "run `k3sm token create` on a server of the cluster; nothing was started"}
	}
	var resp joinv1.ServerBootstrapResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("%s%s: %w", url, joinv1.PathServerBootstrap, err)
	}
	return &resp, nil
}

func get(ctx context.Context, c *http.Client, method, url, bearer string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	r, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if r.StatusCode != http.StatusOK {
		var je joinv1.Error
		if json.Unmarshal(body, &je) == nil && je.Message != "" {
			return nil, &je
		}
		return nil, fmt.Errorf("%s", r.Status)
	}
	return body, nil
}

// Accept fills the new data directory l with a bundle opened from a
// record a server handed out, with the checks Join makes.
func Accept(b Bundle, tok joinv1.Token, l datadir.Layout, mine map[string]string, now time.Time) error {
	return install(b, tok, l, mine, now)
}
