import { serializeTransaction, parseTransaction, keccak256, recoverTransactionAddress } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
const acct = privateKeyToAccount('0x1ab42cc412b618bdea3a599e3c9bae199ebf030895b039e9db1e30dafb12b727');
const to = '0x70997970c51812dc3a010c7d01b50e0d17dc79c8';
const txs = {
  legacy_155: { type: 'legacy', chainId: 1, nonce: 7, gasPrice: 20000000000n, gas: 21000n, to, value: 1000000000000000000n },
  legacy_pre155: { type: 'legacy', nonce: 0, gasPrice: 1n, gas: 21000n, to, value: 5n },
  eip2930: { type: 'eip2930', chainId: 11155111, nonce: 1, gasPrice: 3n, gas: 50000n, to, value: 0n, data: '0xdeadbeef', accessList: [{ address: to, storageKeys: ['0x' + '11'.repeat(32)] }] },
  eip1559: { type: 'eip1559', chainId: 1, nonce: 42, maxFeePerGas: 30000000000n, maxPriorityFeePerGas: 1000000000n, gas: 21000n, to, value: 123456789n },
  eip1559_create: { type: 'eip1559', chainId: 10, nonce: 0, maxFeePerGas: 2n, maxPriorityFeePerGas: 1n, gas: 100000n, value: 0n, data: '0x6080' },
  eip4844: { type: 'eip4844', chainId: 1, nonce: 3, maxFeePerGas: 2n, maxPriorityFeePerGas: 1n, maxFeePerBlobGas: 7n, gas: 21000n, to, value: 0n, blobVersionedHashes: ['0x01' + '22'.repeat(31)] },
  eip7702: { type: 'eip7702', chainId: 1, nonce: 9, maxFeePerGas: 2n, maxPriorityFeePerGas: 1n, gas: 60000n, to, value: 0n,
    authorizationList: [{ address: '0x' + '33'.repeat(20), chainId: 1, nonce: 10, r: '0x' + '44'.repeat(32), s: '0x' + '55'.repeat(32), yParity: 1 }] },
};
const out = {};
for (const [name, tx] of Object.entries(txs)) {
  const unsigned = serializeTransaction(tx);
  const signed = await acct.signTransaction(tx);
  const from = await recoverTransactionAddress({ serializedTransaction: signed });
  out[name] = { unsigned: unsigned.slice(2), signed: signed.slice(2), from };
}
console.log(JSON.stringify(out, null, 1));
