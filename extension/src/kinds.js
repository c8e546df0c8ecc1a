// A colour class per family of layer types (the vocabulary of the .neurarch.json format).

const FAMILIES = [
  ["conv", /conv|patchEmbed/i],
  ["dense", /^(linear|lmHead|bilinear)$/],
  ["attn", /attention|transformerBlock|moeLayer|swiglu|feedForward|lstm|gru|rnn/i],
  ["norm", /norm/i],
  ["pool", /pool|upsample/i],
  ["embed", /embedding|positionalEncoding|rope/i],
  ["drop", /dropout/i],
  ["act", /^(relu|relu6|elu|selu|gelu|swish|mish|hardSwish|hardSigmoid|sigmoid|tanh|softmax|logSoftmax|softplus|glu|prelu|leakyRelu)$/],
  ["merge", /^(add|concatenate|stack)$/],
  ["io", /^(input|output)$/],
];

export function family(type) {
  for (const [name, pattern] of FAMILIES) if (pattern.test(type)) return name;
  return "other";
}
