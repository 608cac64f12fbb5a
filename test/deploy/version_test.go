package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testutil"
)

// releaseVersion is the VERSION file: the one source of the version.
func releaseVersion(t testing.TB) string {
	t.Helper()
	v := repoFile(t, "VERSION")
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?\n$`).MatchString(v) {
		t.Fatalf("VERSION is %q, want one line MAJOR.MINOR.PATCH[-PRE]", v)
	}
	return strings.TrimSpace(v)
}

// makeDryRun is `make -s -n -C <repo> args...` without VERSION, IMAGE,
// COMMIT or BUILDDATE from the environment (the Makefile's ?= would take
// them).
func makeDryRun(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-s", "-n", "-C", testutil.RepoRootT(t)}, args...)...)
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "VERSION", "IMAGE", "COMMIT", "BUILDDATE", "DOCKER", "MAKEFLAGS":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// TestVersionIsOneSource: the VERSION file is the release version, and
// everything that names it agrees: the version `make build` stamps into
// relayd (`relayd version`), the tag `make image` builds, the chart's
// appVersion and the image it renders by default, the comment in
// values.yaml that documents that default, the kustomize base's and the
// example overlay's image tag, and every image tag of relayd that README.md
// and docs/DEPLOY.md show. A release bumps VERSION and these with it.
func TestVersionIsOneSource(t *testing.T) {
	v := releaseVersion(t)

	if out := makeDryRun(t, "build", "GO=go"); !strings.Contains(out, "internal/version.Version="+v+" ") {
		t.Errorf("make build does not stamp version.Version=%s:\n%s", v, out)
	}
	commit := regexp.MustCompile(`internal/version\.Commit=(\S+)`).FindStringSubmatch(makeDryRun(t, "build", "GO=go"))
	if commit == nil || commit[1] == "" || commit[1] == "unknown" {
		t.Errorf("make build stamps no commit: %v", commit)
	}
	for _, tc := range []struct {
		args  []string
		image string
	}{
		{[]string{"image"}, "ghcr.io/relayd/relayd"},
		{[]string{"image", "IMAGE=registry.example.com/relayd"}, "registry.example.com/relayd"},
	} {
		out := strings.TrimSpace(makeDryRun(t, append(tc.args, "COMMIT=abc1234", "BUILDDATE=2000-01-01T00:00:00Z")...))
		want := "docker build -t " + tc.image + ":" + v + " --build-arg VERSION=" + v + " --build-arg COMMIT=abc1234 --build-arg BUILDDATE=2000-01-01T00:00:00Z ."
		if out != want {
			t.Errorf("make -n %s prints\n%s\nwant\n%s", strings.Join(tc.args, " "), out, want)
		}
	}

	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, chartDir+"/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != v {
		t.Errorf("Chart.yaml appVersion %q, VERSION %s", chart.AppVersion, v)
	}
	if img := loadBundle(t, chartDefault).container.Image; img != "ghcr.io/relayd/relayd:"+v {
		t.Errorf("the chart's default image %q, want ghcr.io/relayd/relayd:%s", img, v)
	}
	tagLine := regexp.MustCompile(`(?m)^  tag: "".*$`).FindString(repoFile(t, chartDir+"/values.yaml"))
	if !strings.Contains(tagLine, "appVersion, "+v+" (the VERSION file)") {
		t.Errorf("values.yaml's image.tag line %q does not document the default appVersion %s", tagLine, v)
	}
	for _, dir := range []string{baseDir, overlayDir} {
		if img := loadBundle(t, dir).container.Image; img != "ghcr.io/relayd/relayd:"+v {
			t.Errorf("%s renders image %q, want ghcr.io/relayd/relayd:%s", dir, img, v)
		}
	}
	tagged := regexp.MustCompile(`(ghcr\.io/relayd/relayd|registry\.example\.com/relayd):([^\s` + "`" + `"']+)`)
	for _, doc := range []string{"README.md", "docs/DEPLOY.md", chartDir + "/README.md"} {
		ms := tagged.FindAllStringSubmatch(repoFile(t, doc), -1)
		for _, m := range ms {
			if m[2] != v {
				t.Errorf("%s shows image %s, want the tag %s (the VERSION file)", doc, m[0], v)
			}
		}
		if doc == "README.md" && len(ms) == 0 {
			t.Errorf("README.md names no image with its tag")
		}
	}
}
