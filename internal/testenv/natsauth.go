package testenv

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Operator is a NATS operator with a system account and one application
// account (JetStream enabled, unlimited), for operator-mode servers
// (NATSOptions.Operator). Its users get .creds files from UserCreds.
type Operator struct {
	claims         *jwt.OperatorClaims
	key            nkeys.KeyPair // signs the accounts
	sysPub, sysJWT string
	accPub, accJWT string
	accKey         nkeys.KeyPair
}

// NewOperator creates the operator and signs its two accounts.
func NewOperator() (*Operator, error) {
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	opub, err := okp.PublicKey()
	if err != nil {
		return nil, err
	}
	o := &Operator{key: okp}
	if o.sysPub, o.sysJWT, _, err = newAccount(okp, "SYS", false); err != nil {
		return nil, err
	}
	if o.accPub, o.accJWT, o.accKey, err = newAccount(okp, "APP", true); err != nil {
		return nil, err
	}
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "relayd-testenv"
	oc.SystemAccount = o.sysPub
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return nil, err
	}
	// The server wants the claims as decoded from a signed JWT.
	if o.claims, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		return nil, err
	}
	return o, nil
}

// newAccount creates an account signed by the operator key.
func newAccount(okp nkeys.KeyPair, name string, jetStream bool) (pub, token string, kp nkeys.KeyPair, err error) {
	if kp, err = nkeys.CreateAccount(); err != nil {
		return "", "", nil, err
	}
	if pub, err = kp.PublicKey(); err != nil {
		return "", "", nil, err
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetStream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
			MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
			Streams: jwt.NoLimit, Consumer: jwt.NoLimit,
		}
	}
	if token, err = ac.Encode(okp); err != nil {
		return "", "", nil, err
	}
	return pub, token, kp, nil
}

// AccountPublicKey is the public key ("A...") of the application account.
func (o *Operator) AccountPublicKey() string { return o.accPub }

// UserCreds writes dir/name.creds (mode 0600; the user JWT and seed in
// nats.go's UserCredentials format) for a new user of the application
// account with the given publish and subscribe allow lists (nil allows
// everything) and returns its path.
func (o *Operator) UserCreds(dir, name string, pubAllow, subAllow []string) (string, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		return "", err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return "", err
	}
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.Pub.Allow = pubAllow
	uc.Sub.Allow = subAllow
	token, err := uc.Encode(o.accKey)
	if err != nil {
		return "", err
	}
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// RevokeUser revokes the user of the .creds file credsFile (every JWT
// issued to its key until now) in the application account and gives s the
// account's new JWT, as pushing it to the server's resolver would: s
// closes that user's connections (reason "Revocation") and refuses its
// JWT from then on, later Starts too. Other users of the account, and a
// new user's .creds, are unaffected.
func (o *Operator) RevokeUser(s *server.Server, credsFile string) error {
	b, err := os.ReadFile(credsFile)
	if err != nil {
		return err
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return err
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return err
	}
	ac, err := jwt.DecodeAccountClaims(o.accJWT)
	if err != nil {
		return err
	}
	ac.Revoke(uc.Subject)
	accJWT, err := ac.Encode(o.key)
	if err != nil {
		return err
	}
	if ac, err = jwt.DecodeAccountClaims(accJWT); err != nil {
		return err
	}
	acc, err := s.LookupAccount(o.accPub)
	if err != nil {
		return fmt.Errorf("testenv: account %s: %w", o.accPub, err)
	}
	if err := s.AccountResolver().Store(o.accPub, accJWT); err != nil {
		return err
	}
	s.UpdateAccountClaims(acc, ac)
	o.accJWT = accJWT
	return nil
}

// apply puts the server in operator mode with a memory resolver holding
// both accounts.
func (o *Operator) apply(opts *server.Options) error {
	res := &server.MemAccResolver{}
	if err := res.Store(o.sysPub, o.sysJWT); err != nil {
		return err
	}
	if err := res.Store(o.accPub, o.accJWT); err != nil {
		return err
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{o.claims}
	opts.SystemAccount = o.sysPub
	opts.AccountResolver = res
	return nil
}

// NewNkeyUser makes a user NKey pair, writes its seed to dir/name.nk (mode
// 0600, for nats.NkeyOptionFromSeed) and returns the seed file path and
// the public key ("U...") to put in NATSOptions.Nkeys.
func NewNkeyUser(dir, name string) (seedFile, publicKey string, err error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", "", err
	}
	if publicKey, err = kp.PublicKey(); err != nil {
		return "", "", err
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", "", err
	}
	seedFile = filepath.Join(dir, name+".nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		return "", "", fmt.Errorf("testenv: nkey seed: %w", err)
	}
	return seedFile, publicKey, nil
}
