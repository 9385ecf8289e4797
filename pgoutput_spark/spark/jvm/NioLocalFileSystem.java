package pgoutputspark.fs;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * The file system for file: paths (fs.file.impl): NioRawLocalFileSystem in Hadoop's
 * LocalFileSystem, which writes and reads no ".name.crc" checksum files beside the data.
 *
 * A LocalFileSystem, not the raw one itself: Hadoop code asks for the local file system
 * as one (FileSystem.getLocal casts to it), among others S3A for the disk blocks it
 * buffers uploads in and LocalDirAllocator for temporary files; the raw one there fails
 * that code with a ClassCastException. The wrapper's cost is a stat of the checksum
 * file's name when a file is created, renamed or deleted.
 * Compiled at a local session's start by pgoutput_spark.spark.localfs.
 */
public class NioLocalFileSystem extends LocalFileSystem {
    public NioLocalFileSystem() {
        super(new NioRawLocalFileSystem());
        setWriteChecksum(false);
        setVerifyChecksum(false);
    }
}
