package netns

import (
	"fmt"
	"testing"
	"time"
)

// PollInterval is the pause between two checks of Eventually and Poll.
const PollInterval = 100 * time.Millisecond

// Poll calls cond until it reports true or timeout has passed; cond's last
// message explains a timeout.
func Poll(timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still not true after %v: %s", timeout, msg)
		}
		time.Sleep(PollInterval)
	}
}

// Eventually is Poll that fails the test on timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
