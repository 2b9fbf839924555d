package testenv

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
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

// fakeSetupEnvtest installs, under a setup-envtest store in a temporary
// XDG_DATA_HOME, scripts standing for kube-apiserver and etcd that report
// the given versions, and returns their directory.
func fakeSetupEnvtest(t *testing.T, kube, etcd string) string {
	t.Helper()
	if runtime.GOOS == "windows" || runtime.GOOS == "darwin" {
		t.Skip("the fake store uses the XDG layout")
	}
	data := t.TempDir()
	t.Setenv("XDG_DATA_HOME", data)
	dir := filepath.Join(data, "kubebuilder-envtest", "k8s", strings.TrimPrefix(KubeVersion, "v")+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"kube-apiserver": "Kubernetes " + kube,
		"etcd":           "etcd Version: " + etcd + "\nGit SHA: abc\nGo Version: go1.26",
	} {
		script := "#!/bin/sh\nprintf '%s\\n' '" + strings.ReplaceAll(out, "\n", "' '") + "'\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestAssetsReusesSetupEnvtestBinariesThatFit(t *testing.T) {
	for _, c := range []struct {
		name, kube, etcd string
		fits             bool
	}{
		{"same versions", KubeVersion, strings.TrimPrefix(EtcdVersion, "v"), true},
		{"etcd 3.6", KubeVersion, "3.6.4", true},
		{"etcd 3.4", KubeVersion, "3.4.30", false},
		{"etcd 4", KubeVersion, "4.0.0", false},
		{"another kube-apiserver", "v1.36.2", "3.6.4", false},
		{"unreadable version", "weird", "3.6.4", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := fakeSetupEnvtest(t, c.kube, c.etcd)
			dir, ok := setupEnvtestAssets(t.Context())
			if ok != c.fits || ok && dir != want {
				t.Fatalf("setupEnvtestAssets = %q, %v; want %q, %v", dir, ok, want, c.fits)
			}
			if !c.fits {
				return
			}
			// Assets takes them when its own cache has nothing, and says so.
			t.Setenv(EnvAssets, "")
			t.Setenv(EnvCache, t.TempDir())
			got, from, err := assets(t.Context(), nil)
			if err != nil || got != want || from != fromSetupEnvtest {
				t.Fatalf("assets = %q, %q, %v; want %q from setup-envtest", got, from, err, want)
			}
		})
	}
}
