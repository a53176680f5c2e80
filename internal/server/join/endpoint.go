package join

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/pki"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodePasswordSecret is where the hash of a node's password is kept, as
// k3s keeps it (<node>.node-password.k3s).
func NodePasswordSecret(node string) string { return node + ".node-password.k3sm" }

// nodePasswordType marks those Secrets.
const nodePasswordType corev1.SecretType = "k3sm.io/node-password"

// Endpoint serves the join. ServerCA signs the kubelet serving
// certificates and is the CA every node trusts; ClientCA signs the node
// client certificates, and its certificate is the kubelet API's client CA.
type Endpoint struct {
	Client             kubernetes.Interface
	ServerCA, ClientCA *pki.CA
	Settings           joinv1.ClusterSettings
	Log                *slog.Logger
	// Now is the clock for token expiry (time.Now when nil).
	Now func() time.Time
	// OnJoin, when set, gives an accepted node what it needs in the
	// cluster before its certificates are issued (its agent parts' RBAC).
	OnJoin func(ctx context.Context, node string) error
	// ServerBootstrap, when set (a cluster with embedded etcd), answers
	// PathServerBootstrap for a valid token: what a joining server needs.
	ServerBootstrap func(ctx context.Context, tok joinv1.Token) (*joinv1.ServerBootstrapResponse, error)
	// Servers, when set, lists the cluster's apiservers at the time of a
	// join (this one first); Settings.Servers stands when it fails.
	Servers func(ctx context.Context) ([]string, error)
}

// Handler serves PathCACerts and PathJoin.
func (e *Endpoint) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+joinv1.PathCACerts, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(e.ServerCA.CertPEM())
	})
	mux.HandleFunc("POST "+joinv1.PathJoin, e.join)
	mux.HandleFunc("POST "+joinv1.PathServerBootstrap, e.serverBootstrap)
	return mux
}

func (e *Endpoint) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Endpoint) log() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.Default()
}

func refuse(w http.ResponseWriter, code int, err error) {
	var je *joinv1.Error
	if !errors.As(err, &je) {
		je = &joinv1.Error{Message: err.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(je)
}

func (e *Endpoint) join(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if _, ok := e.authorize(ctx, w, r, "join"); !ok {
		return
	}
	req, csrs, err := joinv1.DecodeJoinRequest(http.MaxBytesReader(w, r.Body, joinv1.MaxRequestBytes+1))
	if err != nil {
		e.log().Warn("join refused", "remote", r.RemoteAddr, "err", err)
		refuse(w, http.StatusBadRequest, &joinv1.Error{Message: err.Error(), Fix: "join with a `k3sm agent` of the server's version"})
		return
	}
	if err := e.checkNodePassword(ctx, req.NodeName, req.NodePassword); err != nil {
		code := http.StatusForbidden
		var je *joinv1.Error
		if !errors.As(err, &je) {
			code = http.StatusServiceUnavailable
		}
		e.log().Warn("join refused", "node", req.NodeName, "remote", r.RemoteAddr, "err", err)
		refuse(w, code, err)
		return
	}
	if e.OnJoin != nil {
		if err := e.OnJoin(ctx, req.NodeName); err != nil {
			e.log().Error("join: the node's RBAC", "node", req.NodeName, "err", err)
			refuse(w, http.StatusServiceUnavailable, &joinv1.Error{Message: "the server could not set up the node's access: " + err.Error(), Fix: "the agent retries; see the server's log"})
			return
		}
	}
	resp, err := e.sign(req.NodeName, csrs)
	if err != nil {
		refuse(w, http.StatusInternalServerError, err)
		return
	}
	if e.Servers != nil {
		if list, err := e.Servers(ctx); err == nil && len(list) > 0 {
			resp.Cluster.Servers = list
		} else if err != nil {
			e.log().Warn("join: the cluster's other servers are not listed to the node", "err", err)
		}
	}
	e.log().Info("node joined", "node", req.NodeName, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// authorize checks the request's bearer token (a valid, unexpired join
// token) and refuses the request when it is not.
func (e *Endpoint) authorize(ctx context.Context, w http.ResponseWriter, r *http.Request, what string) (joinv1.Token, bool) {
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		refuse(w, http.StatusUnauthorized, errBadToken)
		return joinv1.Token{}, false
	}
	if err := checkToken(ctx, e.Client, bearer, e.now()); err != nil {
		code := http.StatusUnauthorized
		if err != errBadToken {
			code = http.StatusServiceUnavailable
		}
		e.log().Warn(what+" refused", "remote", r.RemoteAddr, "err", err)
		refuse(w, code, err)
		return joinv1.Token{}, false
	}
	tok, _ := joinv1.ParseBearer(bearer)
	return tok, true
}

// serverBootstrap hands a joining server the cluster's bootstrap record,
// sealed for the token it presents, once the token checks out.
func (e *Endpoint) serverBootstrap(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if e.ServerBootstrap == nil {
		refuse(w, http.StatusNotFound, &joinv1.Error{Message: "this cluster has no embedded etcd to join",
			Fix: "servers on an external datastore join with --token and the cluster's --datastore-endpoint, without --server"})
		return
	}
	tok, ok := e.authorize(ctx, w, r, "server bootstrap")
	if !ok {
		return
	}
	resp, err := e.ServerBootstrap(ctx, tok)
	if err != nil {
		e.log().Error("server bootstrap", "err", err)
		refuse(w, http.StatusServiceUnavailable, &joinv1.Error{Message: "the server could not hand out the cluster's bootstrap: " + err.Error(), Fix: "see the server's log"})
		return
	}
	e.log().Info("a server fetched the bootstrap record", "remote", r.RemoteAddr, "token", tok.ID)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// checkNodePassword stores the hash of a name's first password and
// refuses a later join of that name with another one. Create, not update:
// of two first joins racing, one wins and the other is compared with it.
func (e *Endpoint) checkNodePassword(ctx context.Context, node, password string) error {
	secrets := e.Client.CoreV1().Secrets(Namespace)
	name := NodePasswordSecret(node)
	for range 2 {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if bcrypt.CompareHashAndPassword(s.Data["hash"], []byte(password)) != nil {
				return &joinv1.Error{Message: fmt.Sprintf("node name %q is taken by another node (its password differs)", node),
					Fix: fmt.Sprintf("pick another --node-name; or, if that node is gone for good, delete its Node and the Secret %s/%s on the server", Namespace, name)}
			}
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("read the node password: %w", err)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
		if err != nil {
			return err
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "k3sm"}},
			Type: nodePasswordType,
			Data: map[string][]byte{"hash": hash},
		}, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("store the node password: %w", err)
		}
	}
	return errors.New("node password: the Secret changed while it was read; join again")
}

// NodeCertValidity is how long a joined node's certificates last.
const NodeCertValidity = pki.LeafValidity

// sign issues the node's client certificate (system:node:<name> in
// system:nodes, for the Node authorizer), its serving certificate (the
// names DecodeJoinRequest allowed) and, when asked, its local-path
// provisioner's client certificate, for the keys the node keeps.
func (e *Endpoint) sign(node string, csrs joinv1.NodeCSRs) (*joinv1.JoinResponse, error) {
	user := joinv1.NodeUser(node)
	cder, err := e.ClientCA.SignPublicKey(pki.LeafSpec{CommonName: user, Organization: []string{joinv1.NodesGroup}, Client: true}, csrs.Client.PublicKey, NodeCertValidity)
	if err != nil {
		return nil, fmt.Errorf("sign the client certificate: %w", err)
	}
	sder, err := e.ServerCA.SignPublicKey(pki.LeafSpec{CommonName: user, Organization: []string{joinv1.NodesGroup},
		DNSNames: csrs.Serving.DNSNames, IPs: csrs.Serving.IPAddresses, Server: true}, csrs.Serving.PublicKey, NodeCertValidity)
	if err != nil {
		return nil, fmt.Errorf("sign the serving certificate: %w", err)
	}
	certPEM := func(der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	resp := &joinv1.JoinResponse{ClientCert: certPEM(cder), ServingCert: certPEM(sder),
		ServerCA: string(e.ServerCA.CertPEM()), KubeletClientCA: string(e.ClientCA.CertPEM()), Cluster: e.Settings}
	if csrs.LocalPath != nil {
		lder, err := e.ClientCA.SignPublicKey(pki.LeafSpec{CommonName: joinv1.LocalPathUser(node), Client: true}, csrs.LocalPath.PublicKey, NodeCertValidity)
		if err != nil {
			return nil, fmt.Errorf("sign the local-path provisioner's certificate: %w", err)
		}
		resp.LocalPathCert = certPEM(lder)
	}
	return resp, nil
}
