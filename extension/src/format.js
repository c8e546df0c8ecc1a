// Number and shape formats, written as neurarch_trace/text.py writes them (the card, the command line
// and the Python fallback HTML use that module), so the picture and the table read the same as the card.

const PREFIXES = ["", "K", "M", "G", "T", "P", "E", "Z", "Y"];

function grouped(value, decimals) {
  return value.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
}

/** [mantissa text with one decimal, SI prefix], 1 <= mantissa < 1000 after rounding. */
function scaled(value) {
  let magnitude = Math.abs(value);
  let index = 0;
  while (magnitude >= 999.95 && index < PREFIXES.length - 1) {
    magnitude /= 1000;
    index += 1;
  }
  return [(value < 0 ? "-" : "") + magnitude.toFixed(1), PREFIXES[index]];
}

const isNumber = (v) => typeof v === "number" && Number.isFinite(v);

/** Parameters: 812, 11.7K, 11.7M, 6.7B (billions, as model names say); "?" when unknown. */
export function count(value) {
  if (!isNumber(value)) return "?";
  if (Math.abs(value) < 1000) return grouped(value, 0);
  const [text, prefix] = scaled(value);
  return text + (prefix === "G" ? "B" : prefix);
}

/** FLOPs: 512 FLOPs, 406.5 KFLOPs, 1.8 GFLOPs; "?" when unknown. */
export function flops(value) {
  if (!isNumber(value)) return "?";
  if (Math.abs(value) < 1000) return `${grouped(value, 0)} FLOPs`;
  const [text, prefix] = scaled(value);
  return `${text} ${prefix}FLOPs`;
}

/** Bytes as GB (10^9 bytes): one decimal, two under 0.1 GB. */
export function gb(numBytes) {
  if (!isNumber(numBytes)) return "?";
  const value = numBytes / 1e9;
  return Math.abs(value) < 0.1 ? `${value.toFixed(2)} GB` : `${grouped(value, 1)} GB`;
}

/** Bytes with an SI prefix (10^3 steps): 512 B, 1.2 MB, 3.4 GB; "?" when unknown. */
export function bytes(numBytes) {
  if (!isNumber(numBytes)) return "?";
  if (Math.abs(numBytes) < 1000) return `${grouped(numBytes, 0)} B`;
  const [text, prefix] = scaled(numBytes);
  return `${text} ${prefix}B`;
}

/** "1 layer", "2 layers". */
export function plural(n, word) {
  return n === 1 ? `${n} ${word}` : `${n} ${word}s`;
}

/** [3, 224, 224] -> "3x224x224"; "-" for none, "scalar" for an empty shape. */
export function shapeText(shape) {
  if (!Array.isArray(shape)) return "-";
  if (shape.length === 0) return "scalar";
  return shape.join("x");
}

/** An exact integer with thousands separators (the table's parameter column). */
export function exact(value) {
  return isNumber(value) ? grouped(value, 0) : "-";
}
