// Package serverboot owns how several k3sm servers share one cluster on
// an external datastore: the bootstrap record (the cluster's CA keys,
// service-account key, encryption configuration and the settings every
// server must agree on), sealed once per join token with AES-256-GCM
// under a key scrypt derives from the token's secret (the token is never
// stored), kept in the datastore; the sync through which every server
// keeps one record per valid token; and a joining server's read of its
// record into a new data directory, so that no file is copied by hand.
package serverboot

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/scrypt"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
)

// Bundle is what a joining server needs that it cannot make itself.
type Bundle struct {
	// Files are the cluster's shared files by their path under the data
	// directory ("server/tls/server-ca.key"), written with mode 0600.
	Files map[string][]byte `json:"files"`
	// Settings are the flags every server of the cluster must give alike,
	// by flag name ("cluster-cidr": "100.64.0.0/10").
	Settings map[string]string `json:"settings"`
	// Expires is the token's expiry (nil: it does not expire): a record
	// outliving its token by a sync's delay still refuses it.
	Expires *time.Time `json:"expires,omitempty"`
}

// sealed is a record as stored: JSON, the salt of the key derivation and
// GCM's nonce beside the ciphertext.
type sealed struct {
	Version int    `json:"v"`
	Salt    []byte `json:"salt"`
	Nonce   []byte `json:"nonce"`
	Data    []byte `json:"data"`
}

// scrypt's cost: about 50 ms per key here, paid once per token and join,
// and 2^15 times that for each guess of a token's 16-character secret.
const (
	scryptN, scryptR, scryptP = 1 << 15, 8, 1
	sealVersion               = 1
)

// ErrWrongToken is Open's error when the token's secret is not the one the
// record was sealed with.
var ErrWrongToken = errors.New("the token's secret does not open the cluster's bootstrap record")

func key(tok joinv1.Token, salt []byte) ([]byte, error) {
	return scrypt.Key([]byte(tok.Secret), salt, scryptN, scryptR, scryptP, 32)
}

// Seal encrypts b for tok: only tok's secret opens it, and only as the
// record of tok's id (the id is authenticated data).
func Seal(b Bundle, tok joinv1.Token) ([]byte, error) {
	plain, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	s := sealed{Version: sealVersion, Salt: make([]byte, 16)}
	if _, err := rand.Read(s.Salt); err != nil {
		return nil, err
	}
	aead, err := gcm(tok, s.Salt)
	if err != nil {
		return nil, err
	}
	s.Nonce = make([]byte, aead.NonceSize())
	if _, err := rand.Read(s.Nonce); err != nil {
		return nil, err
	}
	s.Data = aead.Seal(nil, s.Nonce, plain, []byte(tok.ID))
	return json.Marshal(s)
}

// Open decrypts a record sealed for tok.
func Open(record []byte, tok joinv1.Token) (Bundle, error) {
	var s sealed
	if err := json.Unmarshal(record, &s); err != nil {
		return Bundle{}, fmt.Errorf("the bootstrap record is not one k3sm wrote: %w", err)
	}
	if s.Version != sealVersion {
		return Bundle{}, fmt.Errorf("the bootstrap record is of version %d, this k3sm reads %d: join with a k3sm of the cluster's version", s.Version, sealVersion)
	}
	aead, err := gcm(tok, s.Salt)
	if err != nil {
		return Bundle{}, err
	}
	if len(s.Nonce) != aead.NonceSize() {
		return Bundle{}, errors.New("the bootstrap record is damaged (nonce)")
	}
	plain, err := aead.Open(nil, s.Nonce, s.Data, []byte(tok.ID))
	if err != nil {
		return Bundle{}, ErrWrongToken
	}
	var b Bundle
	if err := json.Unmarshal(plain, &b); err != nil {
		return Bundle{}, fmt.Errorf("the bootstrap record's content: %w", err)
	}
	return b, nil
}

func gcm(tok joinv1.Token, salt []byte) (cipher.AEAD, error) {
	if len(salt) < 16 {
		return nil, errors.New("the bootstrap record is damaged (salt)")
	}
	k, err := key(tok, salt)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
