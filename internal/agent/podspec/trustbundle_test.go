package podspec

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func testCertPEM(t *testing.T, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestTrustBundleProjection(t *testing.T) {
	a, b, c := testCertPEM(t, "a"), testCertPEM(t, "b"), testCertPEM(t, "c")
	ctb := func(name, signer string, lbl map[string]string, certs ...string) certificatesv1.ClusterTrustBundle {
		return certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: strings.Join(certs, "")}}
	}
	tr := &Translator{src: fakeSource{ctbs: []certificatesv1.ClusterTrustBundle{
		ctb("by-name", "", nil, a),
		ctb("s1", "example.com/s", map[string]string{"k": "1"}, a, b),
		ctb("s2", "example.com/s", map[string]string{"k": "2"}, b, c),
		ctb("other", "example.com/other", map[string]string{"k": "1"}, c),
	}}}
	count := func(pemBytes []byte) int { return bytes.Count(pemBytes, []byte("BEGIN CERTIFICATE")) }
	all := &metav1.LabelSelector{}
	for _, tc := range []struct {
		name  string
		p     corev1.ClusterTrustBundleProjection
		certs int
		err   string
	}{
		{name: "by name", p: corev1.ClusterTrustBundleProjection{Name: ptr.To("by-name")}, certs: 1},
		{name: "a missing name", p: corev1.ClusterTrustBundleProjection{Name: ptr.To("nope")}, err: "not found"},
		{name: "a missing name, optional", p: corev1.ClusterTrustBundleProjection{Name: ptr.To("nope"), Optional: ptr.To(true)}},
		{name: "every bundle of the signer, each certificate once", p: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s"), LabelSelector: all}, certs: 3},
		{name: "signer and labels", p: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s"), LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"k": "2"}}}, certs: 2},
		{name: "a nil selector matches nothing", p: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s")}, err: "matched zero"},
		{name: "nothing matches, optional", p: corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s"), Optional: ptr.To(true)}},
	} {
		got, err := tr.trustBundle(context.Background(), &tc.p)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || count(got) != tc.certs {
			t.Errorf("%s: %d certificates (err %v), want %d", tc.name, count(got), err, tc.certs)
		}
	}
	// The order is stable: a refresh does not rewrite an unchanged file.
	p := &corev1.ClusterTrustBundleProjection{SignerName: ptr.To("example.com/s"), LabelSelector: all}
	first, _ := tr.trustBundle(context.Background(), p)
	for range 5 {
		if again, _ := tr.trustBundle(context.Background(), p); !bytes.Equal(first, again) {
			t.Fatal("the projected bundle changed between two reads of the same bundles")
		}
	}
}
