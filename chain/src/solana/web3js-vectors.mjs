import { Keypair, PublicKey, SystemProgram, Transaction, TransactionMessage, VersionedTransaction, TransactionInstruction } from '@solana/web3.js';
const a = Keypair.fromSeed(new Uint8Array(32).fill(7));
const b = Keypair.fromSeed(new Uint8Array(32).fill(8));
const dest = new PublicKey(new Uint8Array(32).fill(9));
const blockhash = new PublicKey(new Uint8Array(32).fill(5)).toBase58();
const out = { a: a.publicKey.toBase58(), b: b.publicKey.toBase58(), dest: dest.toBase58(), blockhash };
// legacy, one signer
let t = new Transaction({ feePayer: a.publicKey, recentBlockhash: blockhash }).add(SystemProgram.transfer({ fromPubkey: a.publicKey, toPubkey: dest, lamports: 1500 }));
out.legacy1_unsigned = t.serialize({ requireAllSignatures: false, verifySignatures: false }).toString('hex');
t.sign(a); out.legacy1_signed = t.serialize().toString('hex');
// legacy, two signers: a pays, b transfers
t = new Transaction({ feePayer: a.publicKey, recentBlockhash: blockhash }).add(SystemProgram.transfer({ fromPubkey: b.publicKey, toPubkey: dest, lamports: 2500 }));
out.legacy2_unsigned = t.serialize({ requireAllSignatures: false, verifySignatures: false }).toString('hex');
t.partialSign(b); out.legacy2_b_signed = t.serialize({ requireAllSignatures: false, verifySignatures: false }).toString('hex');
// v0, one signer, plus an SPL TransferChecked
const TOKEN = new PublicKey('TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA');
const mint = new PublicKey(new Uint8Array(32).fill(10)); const src = new PublicKey(new Uint8Array(32).fill(11)); const dst = new PublicKey(new Uint8Array(32).fill(12));
const data = Buffer.alloc(10); data[0] = 12; data.writeBigUInt64LE(777n, 1); data[9] = 6;
const spl = new TransactionInstruction({ programId: TOKEN, keys: [
  { pubkey: src, isSigner: false, isWritable: true }, { pubkey: mint, isSigner: false, isWritable: false },
  { pubkey: dst, isSigner: false, isWritable: true }, { pubkey: a.publicKey, isSigner: true, isWritable: false }], data });
let msg = new TransactionMessage({ payerKey: a.publicKey, recentBlockhash: blockhash, instructions: [SystemProgram.transfer({ fromPubkey: a.publicKey, toPubkey: dest, lamports: 42 }), spl] }).compileToV0Message();
let v = new VersionedTransaction(msg);
out.v0_1_unsigned = Buffer.from(v.serialize()).toString('hex');
v.sign([a]); out.v0_1_signed = Buffer.from(v.serialize()).toString('hex');
// v0, two signers
msg = new TransactionMessage({ payerKey: a.publicKey, recentBlockhash: blockhash, instructions: [SystemProgram.transfer({ fromPubkey: b.publicKey, toPubkey: dest, lamports: 99 })] }).compileToV0Message();
v = new VersionedTransaction(msg);
out.v0_2_unsigned = Buffer.from(v.serialize()).toString('hex');
v.sign([a]); out.v0_2_a_signed = Buffer.from(v.serialize()).toString('hex');
v.sign([b]); out.v0_2_both_signed = Buffer.from(v.serialize()).toString('hex');
console.log(JSON.stringify(out, null, 1));
