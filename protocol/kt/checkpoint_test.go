package kt

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"
)

func testNoteKeys(t testing.TB, origin string) (note.Signer, note.Verifier) {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

func TestCheckpointSignOpen(t *testing.T) {
	s, v := testNoteKeys(t, "parley.example/kt")
	c := Checkpoint{Origin: "parley.example/kt", Size: 12345, Root: [32]byte{1, 2, 3}}
	text, err := SignCheckpoint(s, c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(text), "parley.example/kt\n12345\nAQID") {
		t.Fatalf("not the tlog-checkpoint format:\n%s", text)
	}
	got, err := OpenCheckpoint(v, text)
	if err != nil || got != c {
		t.Fatalf("OpenCheckpoint = %+v, %v; want %+v", got, err, c)
	}

	_, other := testNoteKeys(t, "parley.example/kt")
	_, otherName := testNoteKeys(t, "evil.example/kt")
	sEvil, _ := testNoteKeys(t, "evil.example/kt")
	evilText, err := SignCheckpoint(sEvil, Checkpoint{Origin: "evil.example/kt", Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(text, []byte("12345"), []byte("12346"), 1)
	cases := []struct {
		name string
		v    note.Verifier
		text []byte
	}{
		{"another key of the same name", other, text},
		{"another name", otherName, text},
		{"tampered size", v, tampered},
		{"another origin's checkpoint", v, evilText},
		{"unsigned", v, []byte(c.Body())},
		{"too long", v, append(bytes.Clone(text), bytes.Repeat([]byte("x"), MaxCheckpointBytes)...)},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			if got, err := OpenCheckpoint(cs.v, cs.text); !errors.Is(err, ErrCheckpoint) {
				t.Fatalf("OpenCheckpoint = %+v, %v; want ErrCheckpoint", got, err)
			}
		})
	}
	if _, err := SignCheckpoint(s, Checkpoint{Origin: "other"}); err == nil {
		t.Fatal("signed a checkpoint of another origin")
	}
}

func TestParseCheckpointStrict(t *testing.T) {
	good := Checkpoint{Origin: "o", Size: 7, Root: [32]byte{9}}.Body()
	if _, err := ParseCheckpoint(good); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		"",
		"o\n7\n",
		"\n7\n" + strings.Split(good, "\n")[2] + "\n",
		"o\n07\n" + strings.Split(good, "\n")[2] + "\n",
		"o\n-7\n" + strings.Split(good, "\n")[2] + "\n",
		"o\n7\nAAAA\n",
		good + "extension\n",
		strings.TrimSuffix(good, "\n"),
	} {
		if c, err := ParseCheckpoint(body); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("ParseCheckpoint(%q) = %+v, %v; want ErrCheckpoint", body, c, err)
		}
	}
}

// FuzzParseCheckpoint: the parser never panics and what it accepts prints
// back to the same body.
func FuzzParseCheckpoint(f *testing.F) {
	f.Add(Checkpoint{Origin: "parley.example/kt", Size: 3, Root: [32]byte{1}}.Body())
	f.Add("o\n0\n" + strings.Repeat("A", 43) + "=\n")
	f.Fuzz(func(t *testing.T, body string) {
		c, err := ParseCheckpoint(body)
		if err != nil {
			return
		}
		if got := c.Body(); got != body {
			t.Fatalf("accepted %q, prints %q", body, got)
		}
	})
}

func TestGenerateKeys(t *testing.T) {
	skey, vkey, vrf, err := GenerateKeys("parley.example/kt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		t.Fatal(err)
	}
	text, err := SignCheckpoint(s, Checkpoint{Origin: "parley.example/kt", Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCheckpoint(v, text); err != nil {
		t.Fatal(err)
	}
	if _, proof := LabelFor(vrf, "u"); len(proof) != VRFProofSize {
		t.Fatalf("proof of %d bytes", len(proof))
	}
}
