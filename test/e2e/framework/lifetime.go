package framework

import (
	"path/filepath"
	"strings"
)

// Lifetimes other than a test's: what a cluster of many processes (see
// test/cluster) needs to run the framework's pieces for a whole test binary,
// or for a command that keeps a cluster up until told to stop.

// Lifetime is what the framework needs of whatever owns the namespaces and
// processes it makes: testing.TB has it, and so does a Suite, which
// outlives every test.
type Lifetime interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Failed() bool
	TempDir() string
}

// Suite is a Lifetime outside any test: Cleanup registers functions that
// Close runs newest first, and Fatalf ends the function Run is running with
// that error. Log lines go to standard error, starting with name.
type Suite struct{ *suite }

// NewSuite returns an empty Suite whose log lines start with name.
func NewSuite(name string) *Suite { return &Suite{&suite{name: name}} }

// Run runs f, returning the error of a Fatalf inside it.
func (s *Suite) Run(f func()) error { return s.run(f) }

// Close runs the cleanups, newest first, and returns every error reported
// while the suite lived.
func (s *Suite) Close() error { return s.close() }

// StartControlPlane is Start for any lifetime, without Start's skip check:
// the caller has decided the machine can run it.
func StartControlPlane(l Lifetime, opts Options) *ControlPlane {
	l.Helper()
	return start(l, opts)
}

// CAFile is the path of the cluster CA's certificate (PEM): the API
// server's --client-ca-file, and what signed its serving certificate.
func (cp *ControlPlane) CAFile() string { return filepath.Join(cp.Dir, "ca.crt") }

// ServiceAccountKeyFile is the path of the key that signs service-account
// tokens (kube-controller-manager's --service-account-private-key-file).
func (cp *ControlPlane) ServiceAccountKeyFile() string { return filepath.Join(cp.Dir, "sa.key") }

// ClientCertFiles writes a new client certificate for user in groups, and
// its key, as dir/NAME.crt and dir/NAME.key (NAME: user with ':' and '/'
// replaced), and returns their paths.
func (cp *ControlPlane) ClientCertFiles(l Lifetime, dir, user string, groups ...string) (cert, key string) {
	l.Helper()
	kp, err := cp.ca.clientCert(user, groups)
	if err != nil {
		l.Fatalf("client certificate for %s: %v", user, err)
	}
	name := strings.NewReplacer(":", "-", "/", "-").Replace(user)
	cert, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeFiles(map[string][]byte{cert: kp.CertPEM, key: kp.KeyPEM}); err != nil {
		l.Fatalf("writing the certificate of %s: %v", user, err)
	}
	return cert, key
}
