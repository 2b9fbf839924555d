package testenv

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestLockDirSerializes(t *testing.T) {
	dir := t.TempDir()
	unlock, err := lockDir(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	got := make(chan error, 1)
	go func() {
		unlock2, err := lockDir(t.Context(), dir, &progress)
		if err == nil {
			unlock2()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second lock taken while the first is held (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "waiting") {
		t.Fatalf("waiting lock said %q", progress.String())
	}

	unlock, err = lockDir(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := lockDir(ctx, dir, &progress); err == nil {
		t.Fatal("lockDir returned without the lock after its context ended")
	}
}

func TestCacheKey(t *testing.T) {
	tools, err := toolsDir()
	if err != nil {
		t.Fatal(err)
	}
	key, err := cacheKey(tools)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, "k8s-"+KubeVersion+"-etcd-"+EtcdVersion+"-") || len(key) != len("k8s-"+KubeVersion+"-etcd-"+EtcdVersion+"-")+12 {
		t.Fatalf("cache key %q", key)
	}
}

func TestNamePrefix(t *testing.T) {
	for in, want := range map[string]string{
		"TestX":                          "testx-",
		"TestA/sub_case#01":              "testa-sub-case-01-",
		"///":                            "test-",
		strings.Repeat("Ab", 30):         strings.Repeat("ab", 20) + "-",
		"Test" + strings.Repeat("-", 50): "test-",
	} {
		if got := namePrefix(in); got != want {
			t.Errorf("namePrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// When its own cache has no binaries, assets takes those setup-envtest
// installed for KubeVersion (envtestbin.SetupEnvtest, which checks their
// versions), and says so.
func TestAssetsReusesSetupEnvtestBinaries(t *testing.T) {
	want := t.TempDir()
	var asked string
	orig := setupEnvtest
	t.Cleanup(func() { setupEnvtest = orig })
	setupEnvtest = func(_ context.Context, kubeVersion string) (string, bool) {
		asked = kubeVersion
		return want, true
	}
	t.Setenv(EnvAssets, "")
	t.Setenv(EnvCache, t.TempDir())
	got, from, err := assets(t.Context(), nil)
	if err != nil || got != want || from != fromSetupEnvtest || asked != KubeVersion {
		t.Fatalf("assets = %q, %q, %v (asked for %q); want %q from setup-envtest for %s", got, from, err, asked, want, KubeVersion)
	}
}
