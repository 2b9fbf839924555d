package syncer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
)

// MaxAnnotationsSize is the API server's limit on the total size of an
// object's annotations: the sum of len(key)+len(value) over all of them.
// A write that would exceed it is refused with ErrRecordTooLarge before
// anything is sent.
const MaxAnnotationsSize = apivalidation.TotalAnnotationSizeLimitB

// dupScanLimit is the list length up to which duplicates are found by
// comparing every pair, which is cheaper than building a set.
const dupScanLimit = 16

// EncodePods returns the annotation value that records pods:
// {"pods":["a","b"]}, in the order given, the format OpenSandbox's
// controller reads and writes. An empty list is {"pods":[]}.
//
// It refuses, with a *RecordError matching ErrMalformedRecord, a list that
// DecodePods would not accept (an invalid pod name, a pod listed twice), and
// with one matching ErrRecordTooLarge a value longer than
// MaxAnnotationsSize. Claim and Key of the error are empty.
func EncodePods(pods []string) (string, error) { return encodePods(pods, false) }

// encodePods is EncodePods; with repeats, a pod may be listed more than
// once.
func encodePods(pods []string, repeats bool) (string, error) {
	if err := checkPods(pods, repeats); err != nil {
		return "", err
	}
	n := len(`{"pods":[]}`) + max(len(pods)-1, 0) // commas
	for _, p := range pods {
		n += len(p) + 2 // quotes
	}
	if n > MaxAnnotationsSize {
		return "", &RecordError{
			Reason: fmt.Sprintf("%d pods take %d bytes, over the limit of %d", len(pods), n, MaxAnnotationsSize),
			Err:    ErrRecordTooLarge,
		}
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(`{"pods":[`)
	for i, p := range pods {
		if i > 0 {
			b.WriteByte(',')
		}
		// A valid pod name holds only [a-z0-9.-]: nothing to escape.
		b.WriteByte('"')
		b.WriteString(p)
		b.WriteByte('"')
	}
	b.WriteString(`]}`)
	return b.String(), nil
}

// DecodePods parses an annotation value written by EncodePods (or by
// OpenSandbox's controller) and returns its pods in the order recorded. The
// empty string, {}, {"pods":null} and {"pods":[]} are an empty list; the
// result is nil then.
//
// It accepts exactly one shape: a JSON object whose only member is "pods"
// (spelled exactly so, given at most once), holding null or an array of
// strings. Anything else is refused with a *RecordError matching
// ErrMalformedRecord whose Reason says why: malformed JSON, another shape,
// another member, a name that is not a valid pod name (a DNS-1123
// subdomain), a pod listed twice. A value longer than MaxAnnotationsSize is
// refused with ErrRecordTooLarge. Claim and Key of the error are empty; the
// caller fills them in.
//
// The returned strings may share memory with value.
func DecodePods(value string) ([]string, error) { return decodePods(value, false) }

// decodePods is DecodePods; with repeats, a pod may be listed more than
// once.
func decodePods(value string, repeats bool) ([]string, error) {
	if value == "" {
		return nil, nil
	}
	if len(value) > MaxAnnotationsSize {
		return nil, &RecordError{
			Reason: fmt.Sprintf("value is %d bytes, over the limit of %d", len(value), MaxAnnotationsSize),
			Err:    ErrRecordTooLarge,
		}
	}
	d := decoder{s: value}
	pods, reason := d.record()
	if reason != "" {
		return nil, &RecordError{Reason: reason, Err: ErrMalformedRecord}
	}
	if err := checkPods(pods, repeats); err != nil {
		return nil, err
	}
	return pods, nil
}

// checkPods refuses invalid pod names and, unless repeats, a pod listed
// twice.
func checkPods(pods []string, repeats bool) error {
	for i, p := range pods {
		if !isDNS1123Subdomain(p) {
			msg := "is not a valid pod name"
			if msgs := content.IsDNS1123Subdomain(p); len(msgs) > 0 {
				msg = strings.Join(msgs, "; ")
			}
			return &RecordError{Reason: fmt.Sprintf("pods[%d] %s: %s", i, quote(p), msg), Err: ErrMalformedRecord}
		}
	}
	if repeats {
		return nil
	}
	if len(pods) <= dupScanLimit {
		for i := 1; i < len(pods); i++ {
			for j := range i {
				if pods[i] == pods[j] {
					return duplicate(pods[i])
				}
			}
		}
		return nil
	}
	seen := make(map[string]struct{}, len(pods))
	for _, p := range pods {
		if _, ok := seen[p]; ok {
			return duplicate(p)
		}
		seen[p] = struct{}{}
	}
	return nil
}

func duplicate(pod string) error {
	return &RecordError{Reason: fmt.Sprintf("pod %s listed twice", quote(pod)), Err: ErrMalformedRecord}
}

// isDNS1123Subdomain reports what content.IsDNS1123Subdomain reports (no
// messages), without a regular expression: at most 253 bytes, dot-separated
// labels of [a-z0-9-], each non-empty and starting and ending with [a-z0-9].
// TestIsDNS1123SubdomainMatchesApimachinery holds the two together.
func isDNS1123Subdomain(s string) bool {
	if len(s) == 0 || len(s) > content.DNS1123SubdomainMaxLength {
		return false
	}
	start := true // at the first byte of a label
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			start = false
		case c == '-':
			if start || i == len(s)-1 || s[i+1] == '.' {
				return false
			}
		case c == '.':
			if start || i == len(s)-1 {
				return false
			}
			start = true
		default:
			return false
		}
	}
	return true
}

// decoder parses the one JSON shape DecodePods accepts. Its methods return
// a reason, empty when all went well.
type decoder struct {
	s string
	i int
}

func (d *decoder) skipSpace() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte, or 0 at the end (the
// input may hold a 0 byte too: check d.i to tell the end).
func (d *decoder) peek() byte {
	d.skipSpace()
	if d.i == len(d.s) {
		return 0
	}
	return d.s[d.i]
}

func (d *decoder) unexpected(want string) string {
	if d.i >= len(d.s) {
		return "malformed JSON: unexpected end, want " + want
	}
	return fmt.Sprintf("malformed JSON at offset %d: unexpected %q, want %s", d.i, d.s[d.i], want)
}

// record parses {"pods": null | [string, ...]}.
func (d *decoder) record() (pods []string, reason string) {
	if d.peek() != '{' {
		if d.i < len(d.s) && (d.s[d.i] == '[' || d.s[d.i] == '"' || d.s[d.i] == 'n' || d.s[d.i] == 't' ||
			d.s[d.i] == 'f' || d.s[d.i] == '-' || ('0' <= d.s[d.i] && d.s[d.i] <= '9')) {
			return nil, fmt.Sprintf(`want a JSON object {"pods":[...]}, got %s`, describe(d.s[d.i]))
		}
		return nil, d.unexpected("'{'")
	}
	d.i++
	seen := false
	if d.peek() == '}' {
		d.i++
	} else {
		for {
			if d.peek() != '"' {
				return nil, d.unexpected("a member name")
			}
			key, reason := d.str()
			if reason != "" {
				return nil, reason
			}
			if key != "pods" {
				return nil, fmt.Sprintf(`unknown member %s: only "pods" is allowed`, quote(key))
			}
			if seen {
				return nil, `member "pods" given twice`
			}
			seen = true
			if d.peek() != ':' {
				return nil, d.unexpected("':'")
			}
			d.i++
			if pods, reason = d.list(); reason != "" {
				return nil, reason
			}
			c := d.peek()
			if c == '}' {
				d.i++
				break
			}
			if c != ',' {
				return nil, d.unexpected("',' or '}'")
			}
			d.i++
		}
	}
	if d.skipSpace(); d.i != len(d.s) {
		return nil, d.unexpected("end of value")
	}
	return pods, ""
}

// list parses null or an array of strings.
func (d *decoder) list() (pods []string, reason string) {
	switch c := d.peek(); c {
	case 'n':
		if strings.HasPrefix(d.s[d.i:], "null") {
			d.i += len("null")
			return nil, ""
		}
		return nil, d.unexpected("null or '['")
	case '[':
		d.i++
	case '{', '"', 't', 'f', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return nil, fmt.Sprintf(`"pods" must be a list of pod names or null, got %s`, describe(c))
	default:
		return nil, d.unexpected("null or '['")
	}
	if d.peek() == ']' {
		d.i++
		return nil, ""
	}
	// Every element takes at least two quotes: a cheap bound on the count.
	pods = make([]string, 0, strings.Count(d.s[d.i:], `"`)/2)
	for {
		c := d.peek()
		if c != '"' {
			if c == 0 || c == ']' || c == ',' {
				return nil, d.unexpected("a string")
			}
			return nil, fmt.Sprintf(`pods[%d] must be a string, got %s`, len(pods), describe(c))
		}
		p, reason := d.str()
		if reason != "" {
			return nil, reason
		}
		pods = append(pods, p)
		c = d.peek()
		if c == ']' {
			d.i++
			return pods, ""
		}
		if c != ',' {
			return nil, d.unexpected("',' or ']'")
		}
		d.i++
	}
}

// str parses a JSON string at d.i, which holds '"'. A string without
// escapes is returned as a slice of the input; one with escapes is decoded
// by encoding/json.
func (d *decoder) str() (string, string) {
	start := d.i
	// Fast path: no escape before the closing quote.
	rest := d.s[start+1:]
	if end := strings.IndexByte(rest, '"'); end >= 0 && strings.IndexByte(rest[:end], '\\') < 0 {
		for i := range end {
			if rest[i] < 0x20 {
				return "", fmt.Sprintf("malformed JSON at offset %d: control character %q in string", start+1+i, rest[i])
			}
		}
		d.i = start + 1 + end + 1
		return rest[:end], ""
	}
	d.i++
	escaped := false
	for d.i < len(d.s) {
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			if !escaped {
				return d.s[start+1 : d.i-1], ""
			}
			var out string
			if err := json.Unmarshal([]byte(d.s[start:d.i]), &out); err != nil {
				return "", fmt.Sprintf("malformed JSON string at offset %d: %v", start, err)
			}
			return out, ""
		case c == '\\':
			escaped = true
			d.i += 2
		case c < 0x20:
			return "", fmt.Sprintf("malformed JSON at offset %d: control character %q in string", d.i, c)
		default:
			d.i++
		}
	}
	d.i = len(d.s)
	return "", "malformed JSON: unterminated string"
}

// quote quotes s for a reason, cut short if long: a record may be large.
func quote(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
}

// describe names the JSON value that starts with c.
func describe(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}
