// Package safetext makes text derived from API objects (namespaces, names,
// port names) safe to write into kernel rules, whatever the object holds.
//
// Both backends write such text into comments (nftables rule, element,
// chain and set comments; iptables' comment match) and nftables also into
// chain and set names. The kernel and the tools bound each form and read
// only some characters back:
//
//   - nftables comments: nft refuses a comment string longer than 128
//     bytes (NFTNL_UDATA_COMMENT_MAXLEN, NUL not counted; the netlink
//     attribute carries the NUL, 129 bytes, within the kernel's 256-byte
//     NFT_USERDATA_MAXLEN), and reads strings between double quotes
//     without escapes: no '"', and '\' and control characters would not
//     survive a round trip through `nft -f` and `nft list`.
//   - iptables comments: 256 bytes including the NUL (XT_MAX_COMMENT_LEN),
//     and iptables-restore splits its input on newlines and quotes, so a
//     '"' or a newline in a comment ends it and starts new rules.
//   - nftables names: at most 255 bytes (NFT_NAME_MAXLEN and
//     NFT_CHAIN_MAXNAMELEN are 256 with the NUL), and nft reads unquoted
//     identifiers of letters, digits and "/-_." only.
//
// API validation keeps such characters out of valid objects, but the file
// source or a future API change may not: the renderers must be safe on
// their own. Text that is already safe is returned unchanged, so normal
// names keep upstream's exact comments.
package safetext

import (
	"crypto/sha256"
	"encoding/base32"
	"unicode/utf8"
)

// Limits of the forms, in bytes, without the terminating NUL.
const (
	// NFTComment is the longest comment nft accepts (and kproxy's netlink
	// adapter sends, followed by a NUL).
	NFTComment = 128
	// IPTablesComment is the longest comment the xt_comment match keeps:
	// XT_MAX_COMMENT_LEN is 256 including the NUL.
	IPTablesComment = 255
	// NFTName is the longest table, chain or set name.
	NFTName = 255
)

// hashLen is the number of base32 characters of the hash appended to text
// that had to be changed: 50 bits, so two different long names do not end
// the same even in a very large cluster.
const hashLen = 10

// sep separates the kept prefix from the hash of the original text.
const sep = '~'

// commentByte reports whether c may appear in a comment as is: printable
// ASCII except the double quote and the backslash.
func commentByte(c byte) bool {
	return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'
}

// nameByte reports whether c may appear in an unquoted nft identifier
// after its first character.
func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '-' || c == '_' || c == '.'
}

// IsComment reports whether s can be written as a comment of at most max
// bytes unchanged.
func IsComment(s string, max int) bool {
	if len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !commentByte(s[i]) {
			return false
		}
	}
	return true
}

// Comment returns s as a comment of at most max bytes of printable ASCII
// without '"' or '\'. Safe text is returned unchanged. Otherwise every
// other character (a byte of invalid UTF-8, or a whole rune) becomes '_',
// and the result is the longest prefix of that which fits, followed by
// '~' and a hash of the whole of s: the prefix keeps the text readable,
// the hash keeps two different texts apart even when their prefixes
// agree. Comment is idempotent: its result is safe, so returned as is.
// max must be more than hashLen+1.
func Comment(s string, max int) string {
	if IsComment(s, max) {
		return s
	}
	return changed(s, max, commentByte)
}

// Name returns s with every character that cannot appear in an unquoted
// nft identifier replaced by '_', unchanged when there is none. It does
// not shorten s: callers put a hash of the original text in the name and
// cut it to NFTName themselves (the hash first, so the cut keeps names
// unique).
func Name(s string) string {
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return string(replace(make([]byte, 0, len(s)), s, len(s), nameByte))
		}
	}
	return s
}

func changed(s string, max int, ok func(byte) bool) string {
	h := hash(s)
	keep := max - len(h) - 1
	if keep < 0 {
		return h[:max]
	}
	b := replace(make([]byte, 0, max), s, keep, ok)
	b = append(b, sep)
	b = append(b, h...)
	return string(b)
}

// replace appends to b the characters of s, each one that ok refuses
// (all bytes of a multi-byte rune, or an invalid byte) as one '_', up to
// keep bytes in all.
func replace(b []byte, s string, keep int, ok func(byte) bool) []byte {
	for i := 0; i < len(s) && len(b) < keep; {
		c := s[i]
		if ok(c) {
			b = append(b, c)
			i++
			continue
		}
		b = append(b, '_')
		if c < utf8.RuneSelf {
			i++
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return b
}

// hash is hashLen base32 characters of a SHA-256 of s, in lower case so
// that it reads as part of a name rather than shouting.
func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:7])
	out := []byte(enc[:hashLen])
	for i, c := range out {
		if c >= 'A' && c <= 'Z' {
			out[i] = c + 'a' - 'A'
		}
	}
	return string(out)
}
