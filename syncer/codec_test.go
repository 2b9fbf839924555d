package syncer_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"pgregory.net/rapid"

	"github.com/poolalloc/poolalloc/syncer"
)

func TestDecodePodsValid(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{``, nil},
		{`{}`, nil},
		{`{"pods":null}`, nil},
		{`{"pods":[]}`, nil},
		{`{"pods":["a"]}`, []string{"a"}},
		{`{"pods":["pool-b","pool-a","x.y-z"]}`, []string{"pool-b", "pool-a", "x.y-z"}},
		{" \t\r\n{ \"pods\" :\n[ \"a\" , \"b\" ] }\n", []string{"a", "b"}},
		{`{"pods":["\u0061\u002db"]}`, []string{"a-b"}},
		{`{"\u0070ods":["a"]}`, []string{"a"}},
		{`{"pods":["` + strings.Repeat("a", 253) + `"]}`, []string{strings.Repeat("a", 253)}},
	} {
		got, err := syncer.DecodePods(tc.in)
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
	}
}

func TestDecodePodsMalformed(t *testing.T) {
	for _, tc := range []struct {
		in     string
		reason string
		err    error
	}{
		{` `, "unexpected end", nil},
		{`{`, "unexpected end", nil},
		{`{"pods":["a"]`, "unexpected end, want ',' or '}'", nil},
		{`{"pods":["a"}`, `unexpected '}', want ',' or ']'`, nil},
		{`{"pods":["a",]}`, `unexpected ']', want a string`, nil},
		{`{"pods":["a"]}x`, "want end of value", nil},
		{`{"pods":["a"]}{}`, "want end of value", nil},
		{"{}\x00", `unexpected '\x00', want end of value`, nil},
		{"{\x00}", `unexpected '\x00', want a member name`, nil},
		{`{"pods":["a]}`, "unterminated string", nil},
		{"{\"pods\":[\"a\tb\"]}", "control character", nil},
		{`{"pods":["\x"]}`, "malformed JSON string", nil},
		{`{pods:["a"]}`, "want a member name", nil},
		{`{"pods"["a"]}`, "want ':'", nil},
		{`{"pods":nul}`, "want null or '['", nil},
		{`[]`, "want a JSON object", nil},
		{`null`, "want a JSON object", nil},
		{`"a"`, "want a JSON object", nil},
		{`7`, "want a JSON object", nil},
		{`{"pods":"a"}`, `"pods" must be a list of pod names or null, got a string`, nil},
		{`{"pods":{}}`, `got an object`, nil},
		{`{"pods":1}`, `got a number`, nil},
		{`{"pods":true}`, `got a boolean`, nil},
		{`{"pods":["a",1]}`, `pods[1] must be a string, got a number`, nil},
		{`{"pods":["a",null]}`, `pods[1] must be a string, got null`, nil},
		{`{"pods":[["a"]]}`, `pods[0] must be a string, got an array`, nil},
		{`{"Pods":["a"]}`, `unknown member "Pods"`, nil},
		{`{"pods":["a"],"extra":1}`, `unknown member "extra"`, nil},
		{`{"pods":["a"],"pods":["b"]}`, `member "pods" given twice`, nil},
		{`{"pods":["a","b","a"]}`, `pod "a" listed twice`, nil},
		{`{"pods":[""]}`, `pods[0] "": `, nil},
		{`{"pods":["Pod-A"]}`, `pods[0] "Pod-A": a lowercase RFC 1123 subdomain`, nil},
		{`{"pods":["a_b"]}`, `pods[0] "a_b"`, nil},
		{`{"pods":["-a"]}`, `pods[0] "-a"`, nil},
		{`{"pods":["a..b"]}`, `pods[0] "a..b"`, nil},
		{`{"pods":["pod-ü"]}`, `pods[0] "pod-ü"`, nil},
		{`{"pods":["` + strings.Repeat("a", 254) + `"]}`, `must be no more than 253`, nil},
		{strings.Repeat(" ", syncer.MaxAnnotationsSize+1), "over the limit", syncer.ErrRecordTooLarge},
	} {
		got, err := syncer.DecodePods(tc.in)
		require.Nil(t, got, "%q", tc.in)
		want := tc.err
		if want == nil {
			want = syncer.ErrMalformedRecord
		}
		require.ErrorIs(t, err, want, "%q", tc.in)
		var re *syncer.RecordError
		require.ErrorAs(t, err, &re, "%q", tc.in)
		require.Contains(t, re.Reason, tc.reason, "%q", tc.in)
		require.Zero(t, re.Claim)
		require.Empty(t, re.Key)
		require.Equal(t, re.Reason+": "+want.Error(), err.Error())
	}
}

func TestDecodePodsDuplicatesInLongList(t *testing.T) {
	pods := make([]string, 100)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%d", i)
	}
	v, err := syncer.EncodePods(pods)
	require.NoError(t, err)
	got, err := syncer.DecodePods(v)
	require.NoError(t, err)
	require.Equal(t, pods, got)

	pods[99] = "pod-7"
	_, err = syncer.EncodePods(pods)
	require.ErrorContains(t, err, `pod "pod-7" listed twice`)
	v = strings.Replace(v, `"pod-99"`, `"pod-7"`, 1)
	_, err = syncer.DecodePods(v)
	require.ErrorContains(t, err, `pod "pod-7" listed twice`)
}

// opensandboxRecord is the shape OpenSandbox's controller marshals.
type opensandboxRecord struct {
	Pods []string `json:"pods"`
}

func TestEncodePodsMatchesOpenSandbox(t *testing.T) {
	for _, pods := range [][]string{{}, {"a"}, {"pool-x7k2p", "pool-9qz4m", "a.b-c"}} {
		got, err := syncer.EncodePods(pods)
		require.NoError(t, err)
		want, err := json.Marshal(opensandboxRecord{pods})
		require.NoError(t, err)
		require.Equal(t, string(want), got)
	}
	got, err := syncer.EncodePods(nil)
	require.NoError(t, err)
	require.Equal(t, `{"pods":[]}`, got)
}

func TestEncodePodsRefuses(t *testing.T) {
	for _, tc := range []struct {
		pods []string
		err  error
	}{
		{[]string{""}, syncer.ErrMalformedRecord},
		{[]string{`a"b`}, syncer.ErrMalformedRecord},
		{[]string{"A"}, syncer.ErrMalformedRecord},
		{[]string{"a", "a"}, syncer.ErrMalformedRecord},
		{manyPods(1100, 240), syncer.ErrRecordTooLarge},
	} {
		_, err := syncer.EncodePods(tc.pods)
		require.ErrorIs(t, err, tc.err)
		var re *syncer.RecordError
		require.ErrorAs(t, err, &re)
	}
}

func manyPods(n, length int) []string {
	pods := make([]string, n)
	for i := range pods {
		s := fmt.Sprintf("p%d-", i)
		pods[i] = s + strings.Repeat("x", length-len(s))
	}
	return pods
}

// genPodName draws valid pod names: mostly short, sometimes with dots and
// dashes, sometimes at the length limit.
func genPodName() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.StringMatching(`[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?`),
		rapid.StringMatching(`[a-z0-9]{1,5}(\.[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?){1,4}`),
		rapid.Custom(func(t *rapid.T) string {
			return strings.Repeat("a", rapid.IntRange(240, 252).Draw(t, "pad")) + rapid.StringMatching(`[0-9]`).Draw(t, "tail")
		}),
	)
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pods := rapid.SliceOfDistinct(genPodName(), rapid.ID).Draw(t, "pods")
		v, err := syncer.EncodePods(pods)
		require.NoError(t, err)
		got, err := syncer.DecodePods(v)
		require.NoError(t, err)
		if len(pods) == 0 {
			require.Empty(t, got)
			return
		}
		require.Equal(t, pods, got)
		want, err := json.Marshal(opensandboxRecord{pods})
		require.NoError(t, err)
		require.Equal(t, string(want), v)
	})
}

// genNearRecord draws strings that look like records, so that the
// differential test reaches past the first byte.
func genNearRecord() *rapid.Generator[string] {
	tokens := []string{`{`, `}`, `[`, `]`, `,`, `:`, ` `, `"pods"`, `"Pods"`, `"x"`, `null`, `true`, `1`,
		`"a"`, `"b"`, `"a-b.c"`, `"A"`, `""`, `"\u0061"`, `"\"`, `"\n"`, "\"\t\"", `"a`, `\`, "\xff", `"ü"`, "\x00"}
	return rapid.OneOf(
		rapid.String(),
		rapid.Custom(func(t *rapid.T) string {
			return strings.Join(rapid.SliceOf(rapid.SampledFrom(tokens)).Draw(t, "tokens"), "")
		}),
		rapid.Custom(func(t *rapid.T) string {
			pods := rapid.SliceOf(rapid.OneOf(genPodName(), rapid.SampledFrom([]string{"a", "A", "", "a_b", "-"}))).Draw(t, "pods")
			b, _ := json.Marshal(opensandboxRecord{pods})
			s := string(b)
			if rapid.Bool().Draw(t, "mangle") && len(s) > 0 {
				i := rapid.IntRange(0, len(s)-1).Draw(t, "at")
				s = s[:i] + rapid.SampledFrom(tokens).Draw(t, "insert") + s[i:]
			}
			return s
		}),
	)
}

// TestDecodePodsMatchesOracle checks DecodePods against a slow reference
// built on encoding/json and apimachinery's validation: both accept the
// same inputs with the same result, and DecodePods never panics.
func TestDecodePodsMatchesOracle(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		checkAgainstOracle(t, genNearRecord().Draw(t, "value"))
	})
}

func checkAgainstOracle(t require.TestingT, value string) {
	got, err := syncer.DecodePods(value)
	want, ok := oracleDecode(value)
	if !ok {
		require.Error(t, err, "DecodePods accepted %q as %q", value, got)
		require.True(t, errors.Is(err, syncer.ErrMalformedRecord) || errors.Is(err, syncer.ErrRecordTooLarge), "%q: %v", value, err)
		var re *syncer.RecordError
		require.ErrorAs(t, err, &re)
		require.NotEmpty(t, re.Reason)
		return
	}
	require.NoError(t, err, "DecodePods refused %q", value)
	require.Equal(t, want, got, "%q", value)
}

// oracleDecode is the reference for DecodePods.
func oracleDecode(value string) ([]string, bool) {
	if value == "" {
		return nil, true
	}
	if len(value) > syncer.MaxAnnotationsSize || !json.Valid([]byte(value)) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(value)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var pods []string
	seen := false
	for dec.More() {
		key, err := dec.Token()
		if err != nil || key != "pods" || seen {
			return nil, false
		}
		seen = true
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		if tok == nil {
			continue
		}
		if tok != json.Delim('[') {
			return nil, false
		}
		for dec.More() {
			tok, err := dec.Token()
			s, isString := tok.(string)
			if err != nil || !isString {
				return nil, false
			}
			pods = append(pods, s)
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
			return nil, false
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	for i, p := range pods {
		if len(content.IsDNS1123Subdomain(p)) > 0 || slices.Contains(pods[:i], p) {
			return nil, false
		}
	}
	return pods, true
}

func FuzzDecodePods(f *testing.F) {
	// More seeds live in testdata/fuzz/FuzzDecodePods.
	f.Add(`{"pods":["a","b"]}`)
	f.Add(`{"pods":null}`)
	f.Fuzz(func(t *testing.T, value string) {
		checkAgainstOracle(t, value)
	})
}

// TestIsDNS1123SubdomainMatchesApimachinery checks, through EncodePods,
// that the pod name check agrees with apimachinery's.
func TestIsDNS1123SubdomainMatchesApimachinery(t *testing.T) {
	check := func(t require.TestingT, name string) {
		_, err := syncer.EncodePods([]string{name})
		valid := len(content.IsDNS1123Subdomain(name)) == 0
		require.Equal(t, valid, err == nil, "%q: apimachinery says valid=%v, EncodePods says %v", name, valid, err)
	}
	for _, name := range []string{"", "a", "0", "a-b", "a.b", "a-", "-a", "a.", ".a", "a..b", "a.-b", "a-.b",
		"a--b", "A", "a_b", "a b", strings.Repeat("a", 253), strings.Repeat("a", 254),
		strings.Repeat("a", 63) + "." + strings.Repeat("b", 100)} {
		check(t, name)
	}
	rapid.Check(t, func(t *rapid.T) {
		check(t, rapid.StringOfN(rapid.SampledFrom([]rune("ab09-.A_/é")), 0, 260, -1).Draw(t, "name"))
	})
}

func BenchmarkDecodePods(b *testing.B) {
	for _, n := range []int{1, 100} {
		pods := make([]string, n)
		for i := range pods {
			pods[i] = fmt.Sprintf("pool-7f9c8d6b5-%05d", i)
		}
		v, err := syncer.EncodePods(pods)
		require.NoError(b, err)
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(v)))
			for b.Loop() {
				if _, err := syncer.DecodePods(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncodePods(b *testing.B) {
	for _, n := range []int{1, 100} {
		pods := make([]string, n)
		for i := range pods {
			pods[i] = fmt.Sprintf("pool-7f9c8d6b5-%05d", i)
		}
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := syncer.EncodePods(pods); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestEncodePodsSizeLimitIsExact(t *testing.T) {
	// k names of 253 bytes encode to 10+256k bytes; one more name of l
	// bytes adds l+3. Pick them to land on the limit exactly.
	k := (syncer.MaxAnnotationsSize - 10 - 4) / 256
	l := syncer.MaxAnnotationsSize - (10 + 256*k) - 3
	require.LessOrEqual(t, l, 253)
	pods := append(manyPods(k, 253), strings.Repeat("z", l))

	v, err := syncer.EncodePods(pods)
	require.NoError(t, err)
	require.Len(t, v, syncer.MaxAnnotationsSize)
	got, err := syncer.DecodePods(v)
	require.NoError(t, err)
	require.Equal(t, pods, got)

	pods[k] += "z"
	_, err = syncer.EncodePods(pods)
	require.ErrorIs(t, err, syncer.ErrRecordTooLarge, "one byte over")
	_, err = syncer.DecodePods(v + " ")
	require.ErrorIs(t, err, syncer.ErrRecordTooLarge, "one byte over")
}
