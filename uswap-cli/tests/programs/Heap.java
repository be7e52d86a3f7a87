// A Java heap of long[] arrays, MIB MiB in all, written, then read back twice with every
// element checked; prints a checksum. Its output depends only on its argument.
// Usage: java Heap MIB
public class Heap {
    public static void main(String[] args) {
        int mib = Integer.parseInt(args[0]);
        int per = 1 << 15; // 256 KiB arrays: below G1's humongous size for small heaps
        long[][] arrays = new long[mib * 4][];
        for (int i = 0; i < arrays.length; i++) {
            arrays[i] = new long[per];
            for (int j = 0; j < per; j++) arrays[i][j] = (long) i * per + j * 31L;
        }
        long sum = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < arrays.length; i++)
                for (int j = 0; j < per; j++) {
                    long v = arrays[i][j];
                    if (v != (long) i * per + j * 31L) {
                        System.err.println("wrong element " + i + "/" + j);
                        System.exit(3);
                    }
                    sum += v ^ pass;
                }
        System.out.println("checksum " + sum);
    }
}
