package envtestbin

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fakeStore installs, under a setup-envtest store in a temporary
// XDG_DATA_HOME, scripts standing for kube-apiserver and etcd that report
// the given versions, and returns their directory.
func fakeStore(t *testing.T, kube, etcd string) string {
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

func TestSetupEnvtestTakesBinariesThatFit(t *testing.T) {
	for _, c := range []struct {
		name, kube, etcd string
		fits             bool
	}{
		{"same versions", KubeVersion, "3.7.3", true},
		{"etcd 3.6", KubeVersion, "3.6.4", true},
		{"etcd 3.4", KubeVersion, "3.4.30", false},
		{"etcd 4", KubeVersion, "4.0.0", false},
		{"another kube-apiserver", "v1.36.2", "3.6.4", false},
		{"unreadable version", "weird", "3.6.4", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := fakeStore(t, c.kube, c.etcd)
			dir, ok := SetupEnvtest(t.Context(), KubeVersion)
			if ok != c.fits || ok && dir != want {
				t.Fatalf("SetupEnvtest = %q, %v; want %q, %v", dir, ok, want, c.fits)
			}
		})
	}
}

func TestSetupEnvtestWithoutBinaries(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	if dir, ok := SetupEnvtest(t.Context(), KubeVersion); ok {
		t.Fatalf("SetupEnvtest on an empty store = %q, true", dir)
	}
	dir := fakeStore(t, KubeVersion, "3.6.4")
	if err := os.Chmod(filepath.Join(dir, "etcd"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := SetupEnvtest(t.Context(), KubeVersion); ok {
		t.Fatal("SetupEnvtest took an etcd that is not executable")
	}
}

func TestBinaryVersionNamesTheBinary(t *testing.T) {
	dir := fakeStore(t, KubeVersion, "3.6.4")
	bin := filepath.Join(dir, "etcd")
	if v, err := BinaryVersion(t.Context(), bin, "etcd Version: "); err != nil || v != "v3.6.4" {
		t.Fatalf("BinaryVersion = %q, %v; want v3.6.4", v, err)
	}
	_, err := BinaryVersion(t.Context(), bin, "Kubernetes ")
	if err == nil || !strings.Contains(err.Error(), bin) || !strings.Contains(err.Error(), `"Kubernetes "`) {
		t.Fatalf("BinaryVersion with a prefix no line has: %v", err)
	}
	if _, err := BinaryVersion(t.Context(), filepath.Join(dir, "missing"), "x"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("BinaryVersion of a missing binary: %v", err)
	}
}
